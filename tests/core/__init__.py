"""Tests of the pipeline core: admission, close, supervision, collectives, trio's rules."""
