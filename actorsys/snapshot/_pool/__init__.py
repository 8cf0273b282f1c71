"""The reused CPU buffer sets a point's weights are copied into, each point's lease on one, and
faulting them in ahead of the first point.
"""
