"""Writing a snapshot as a Hugging Face checkpoint: the safetensors files, the model files beside
them, durably.
"""
