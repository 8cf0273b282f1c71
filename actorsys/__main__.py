"""``python -m actorsys``: the command line (see ``actorsys.cli``)."""

from __future__ import annotations

import sys

from actorsys.cli import main

if __name__ == "__main__":
    sys.exit(main())
