"""The pin of a fleet and the proof of what it serves: the pin's steps, the weight probe, its
reference and its verdict.
"""
