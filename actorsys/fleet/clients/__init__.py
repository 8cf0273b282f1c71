"""The clients of the engines a fleet is made of: sglang's API (also the CPU engine's), vLLM's, and
completions through a pinned fleet.
"""
