"""The demo: a tiny model learns 2-digit addition while actorsys evaluates it live."""
