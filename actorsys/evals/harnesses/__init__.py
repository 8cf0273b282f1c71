"""The eval fns: datasets on the pinned fleet or an external server, lm-evaluation-harness, the
OpenAI SDK and inspect-ai.
"""
