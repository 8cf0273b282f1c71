"""peft LoRA models exported merged: the plan, the merge in the export thread, the plan's reuse,
and the frozen base kept across points.
"""
