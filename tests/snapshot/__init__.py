"""Tests of the weight copy and the snapshot writer."""
