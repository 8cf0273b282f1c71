"""How often a trainer exits cleanly right after closing a bridge over a ~1 GB model.

    .venv/bin/python bench/clean_exit.py [--runs 20] [--kinds sync,async]
                                         [--source checkpoint|model] [--close-timeout S]

Each run is one process (``tests/bridge/exit_host.py run``): a bridge with a ~1 GB base
checkpoint (its buffer sets are faulted in in the background from the start), one point
submitted, close, and the process returns from ``main``. A thread of the pipeline still
inside a torch op when the interpreter finalizes aborts the process (SIGABRT,
"terminate called without an active exception"). Prints, per bridge kind, how many runs
exited 0 and the exit codes of the others.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time

HOST = os.path.join(os.path.dirname(__file__), "..", "tests", "bridge", "exit_host.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--kinds", default="sync,async")
    parser.add_argument("--source", choices=["checkpoint", "model"], default="checkpoint")
    parser.add_argument("--close-timeout", type=float, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="actorsys-clean-exit-") as work:
        base = os.path.join(work, "base")
        subprocess.run([sys.executable, HOST, "make-base", base], check=True)
        print(f"{'bridge':<8}{'runs':>6}{'exit 0':>8}  {'others (exit code: count)':<28}"
              f"{'s/run':>7}")
        for kind in args.kinds.split(","):
            codes: collections.Counter[int] = collections.Counter()
            started = time.monotonic()
            for run in range(args.runs):
                command = [sys.executable, HOST, "run", kind, base,
                           os.path.join(work, f"staging-{kind}-{run}"), "--source", args.source]
                if args.close_timeout is not None:
                    command += ["--close-timeout", str(args.close_timeout)]
                done = subprocess.run(command, capture_output=True, text=True, timeout=300)
                codes[done.returncode] += 1
            per_run = (time.monotonic() - started) / args.runs
            others = ", ".join(f"{code}: {n}" for code, n in sorted(codes.items()) if code != 0)
            print(f"{kind:<8}{args.runs:>6}{codes[0]:>8}  {others or '-':<28}{per_run:>7.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
