"""Tests of the actor kernel."""
