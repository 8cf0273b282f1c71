"""The embedded CPU engine: a transformers model served over the sglang API subset.

Start one with ``python -m actorsys engine --model DIR --port P``; reach it with
:class:`actorsys.SGLangEngine`. It starts in seconds and is the default fleet of the demo and
of the tests; vLLM and sglang are the production fleets behind the same clients.
"""

API_KEY_ENV = "ACTORSYS_API_KEY"
"""The environment variable the engine reads its API key from (``--api-key`` overrides it)."""
