"""Tests of the shared leaves: the config and its flags, JSONL files, private files, the lazy package."""
