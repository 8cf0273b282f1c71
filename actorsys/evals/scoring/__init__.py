"""How answers are graded: scorers (built-in, miles' reward types, a remote reward model), the
worker processes they run in, and a dataset's metrics.
"""
