"""What to evaluate: datasets, their checks, the YAML eval config, miles' eval flags, and the
prompts one snapshot is sent.
"""
