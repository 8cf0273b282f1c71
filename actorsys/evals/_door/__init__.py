"""The door of one evaluation to its pinned fleet: the request gate, what passes it, and its
HTTP/1.1 wire.
"""
