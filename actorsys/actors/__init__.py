"""The four actors of the pipeline. Each is a loop over its inbox; all point state lives in
:class:`actorsys._pipeline.Pipeline`."""
