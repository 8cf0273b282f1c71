"""The examples run as a user runs them."""
