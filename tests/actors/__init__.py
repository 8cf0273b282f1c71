"""Tests of the four actors, one stage each."""
