"""The pipeline's core: the supervisor facade, admission, the points in flight, the actors
that move them forward, drain and close. Private: hosts use :mod:`actorsys.supervisor`, and
nothing here imports a feature module (evaluations, the command line, watch)."""
