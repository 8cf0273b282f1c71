"""'actorsys watch DIR': evaluate every complete checkpoint under DIR exactly once, in step
order, with the same evaluation flags a trainer uses ('--eval-config' or '--eval-prompt-data',
'--eval-timeout', '--eval-probe', ...).

A checkpoint is a subdirectory whose name ends in its step number; it is complete when it
holds '.complete', or, for a transformers 'checkpoint-N', once the trainer has written its
'trainer_state.json' (the last file it saves). '--marker NAME' names the one file that marks a
complete checkpoint instead (prime-rl: STABLE); with '--quiet-seconds', a checkpoint nothing
in which changed for that long is complete too. DIR is polled every '--poll-interval' seconds
(no inotify: it fires on no network filesystem); symlinks out of DIR are never followed.
OUT/ledger.jsonl records every attempt, keyed by checkpoint (its name and a fingerprint of its
weight files: one rewritten in place is evaluated again) and by a hash of the eval settings; a
restart resumes from it, and new eval settings re-evaluate the backlog. A failed point is
retried up to '--max-attempts' times, then recorded 'failed'; one the server refused as a bad
request is recorded failed at once, with the server's message. OUT/metrics.jsonl gets one line
per attempt; each settled point is also printed on stdout. One watch at a time holds
OUT/.lock. '--once' processes the backlog and exits 0, or 1 if a point failed. Ctrl-C stops
within '--eval-close-timeout' (exit 130).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any

from actorsys._flags import int_at_least, seconds
from actorsys.cli._conventions import EXIT_INTERRUPTED, add_log_level, existing_dir, setup_logging
from actorsys.outcome import Outcome

log = logging.getLogger("actorsys.watch")


def add_watch_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from actorsys.config import EvalConfig

    parser = subparsers.add_parser(
        "watch",
        help="evaluate every complete checkpoint under a directory, once, in step order",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", metavar="DIR", type=existing_dir, help="the checkpoint directory")
    _hide_watch_owned(EvalConfig.add_arguments(parser))
    engines = parser.add_argument_group("where to evaluate")
    where = engines.add_mutually_exclusive_group()
    where.add_argument("--engines", type=int_at_least(1), metavar="N",
                       help="start N CPU engines serving the first checkpoint (default 1)")
    where.add_argument("--engine-url", nargs="+", metavar="URL",
                       help="evaluate on servers that run anyway (vLLM or sglang), one fleet each")
    engines.add_argument("--engine-api-key", metavar="KEY", default=None,
                         help="the --engine-url servers' key, sent as 'Authorization: Bearer "
                              "KEY' (default: $ACTORSYS_API_KEY; prefer that: a key on the "
                              "command line is visible to every local user, in ps and /proc)")
    engines.add_argument("--fleets", type=int_at_least(1), metavar="K",
                         help="deal the engines into K fleets that evaluate in parallel "
                              "(default: 1 for --engines, one per --engine-url)")
    engines.add_argument("--flavor", choices=("auto", "vllm", "sglang"), default="auto",
                         help="the servers' API (auto: ask them); with --engines, vllm starts "
                              "vLLM's CPU server from .venv-vllm instead of the embedded engine")
    when = parser.add_argument_group("when")
    when.add_argument("--catchup", choices=("all", "latest"), default="all",
                      help="at start, evaluate the whole backlog (all) or only the newest "
                           "complete checkpoint (latest)")
    when.add_argument("--once", action="store_true", help="process the backlog, then exit")
    when.add_argument("--poll-interval", type=seconds, default=10.0, metavar="S",
                      help="seconds between scans of DIR (default 10)")
    when.add_argument("--marker", type=file_name, default=None, metavar="NAME",
                      help="the file that marks a complete checkpoint (prime-rl: STABLE); "
                           "default: .complete, or a transformers checkpoint-N's "
                           "trainer_state.json")
    when.add_argument("--quiet-seconds", type=seconds, default=None, metavar="S",
                      help="a checkpoint without its marker is complete once nothing in it "
                           "changed for S seconds")
    when.add_argument("--max-attempts", type=int_at_least(1), default=3, metavar="N",
                      help="attempts at one checkpoint before it is recorded failed (default 3)")
    results = parser.add_argument_group("results")
    results.add_argument("--out", metavar="OUT", default="actorsys-watch",
                         help="where ledger.jsonl and metrics.jsonl go (default ./actorsys-watch)")
    results.add_argument("--tensorboard", metavar="LOGDIR", help="also write TensorBoard scalars here")
    results.add_argument("--wandb-project", metavar="P", help="also log to this wandb project")
    add_log_level(parser, default="info")
    parser.set_defaults(run=run_watch, parser=parser)


def _hide_watch_owned(group: argparse._ArgumentGroup) -> None:
    """Leave the flags watch sets itself out of its --help (run_watch refuses them)."""
    from actorsys import _flags
    from actorsys.watch.service import WATCH_OWNED_FIELDS

    owned = {flag.dest for flag in _flags.FLAGS if flag.field in WATCH_OWNED_FIELDS}
    for action in group._group_actions:
        if action.dest in owned:
            action.help = argparse.SUPPRESS


def file_name(text: str) -> str:
    if not text or text in (".", "..") or "/" in text or "\0" in text:
        raise argparse.ArgumentTypeError(f"expected a file name (no '/'), got {text!r}")
    return text


def run_watch(args: argparse.Namespace) -> int:
    import trio

    from actorsys._errors import ConfigError, UnsafePathError, WatchOutInUseError
    from actorsys.evals import DatasetEval, datasets_from_args
    from actorsys.fleet.fleet import EngineUnhealthyError
    from actorsys.fleet.local import FleetStartError
    from actorsys.watch.service import Watcher, WatchSettings, eval_key

    parser: argparse.ArgumentParser = args.parser
    setup_logging(args.log_level)
    config = _eval_config(args, parser)
    try:
        datasets = datasets_from_args(args)
    except ConfigError as exc:
        parser.error(str(exc).splitlines()[0])
    if not datasets:
        parser.error("no eval datasets; pass --eval-config FILE or --eval-prompt-data NAME PATH")
    out = os.path.abspath(args.out)
    problem = unusable_out(out)
    if problem is not None:
        parser.error(f"argument --out: {problem}")
    fleets_for = _fleets_for(args, parser)
    settings = WatchSettings(
        root=os.path.abspath(args.dir),
        out=out,
        catchup=args.catchup,
        once=args.once,
        poll_interval=args.poll_interval,
        quiet_seconds=args.quiet_seconds,
        marker=args.marker,
        max_attempts=args.max_attempts,
        config=config,
    )
    sinks = _sinks(args)
    try:
        watcher = Watcher(
            settings, eval_fn=DatasetEval(datasets), eval_key=eval_key(datasets),
            fleets_for=fleets_for, sink=sinks,
        )
        log.info("watching %s (eval key %s); ledger %s/ledger.jsonl", settings.root,
                 watcher.eval_key, settings.out)
        report = trio.run(_serve, watcher)
    except BaseExceptionGroup as group:
        in_use = group.subgroup((WatchOutInUseError, UnsafePathError))
        if in_use is not None:
            sys.stderr.write(f"actorsys watch: {_first_leaf(in_use)}\n")
            return 2
        unusable = group.subgroup((FleetStartError, EngineUnhealthyError))
        if unusable is None:
            raise
        first = str(_first_leaf(unusable)).splitlines()[0].removesuffix("; log tail:")
        sys.stderr.write(
            f"actorsys watch: no engines to evaluate on: {first} (logs in {settings.out}/logs)\n"
        )
        return 1
    finally:
        sinks.close()
    if report.interrupted:
        return EXIT_INTERRUPTED
    print(f"evaluated {len(report.ok)} checkpoints ok, {len(report.failed)} failed "
          f"{report.failed}, {len(report.vanished)} vanished {report.vanished}", flush=True)
    return 1 if report.failed else 0


def _eval_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    """The eval settings the trainer's flags give; a flag watch sets itself is refused."""
    from actorsys import _flags
    from actorsys._errors import ConfigError
    from actorsys.config import EvalConfig
    from actorsys.watch.service import WATCH_OWNED_FIELDS

    for field in _flags.config_kwargs(args):
        if field in WATCH_OWNED_FIELDS:
            parser.error(f"argument {_flags.flag_of(field)}: watch evaluates the checkpoints "
                         "under DIR in place, one per fleet at a time; leave it out")
    try:
        return EvalConfig.from_args(args)
    except ConfigError as exc:
        parser.error(" ".join([str(exc), *getattr(exc, "__notes__", [])]))


def unusable_out(out: str) -> str | None:
    """Why ``out`` cannot hold watch's output (creating it if it is missing), or None."""
    if os.path.exists(out) and not os.path.isdir(out):
        return f"{out} exists and is not a directory; pass a directory"
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        return f"cannot create {out} ({exc.strerror or exc}); pass a directory you can write"
    if not os.access(out, os.W_OK | os.X_OK):
        return f"{out} is not writable; pass a directory you can write"
    return None


def _first_leaf(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


async def _serve(watcher: Any) -> Any:
    import trio

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_interrupt_on_signal, watcher)
        report = await watcher.run()
        nursery.cancel_scope.cancel()
    return report


async def _interrupt_on_signal(watcher: Any) -> None:
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            sys.stderr.write(f"actorsys watch: {signal.Signals(signum).name}, stopping\n")
            await watcher.interrupt()
            return


def _fleets_for(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    from actorsys.watch.fleets import attached_fleets, started_fleets, vllm_missing

    if args.engine_url:
        count = args.fleets or len(args.engine_url)
        if count > len(args.engine_url):
            parser.error(f"argument --fleets: {count} > the {len(args.engine_url)} --engine-url "
                         "servers; pass at most one fleet per server")

        if args.engine_api_key:
            log.warning("--engine-api-key puts the key on the command line, where every local "
                        "user can read it; set ACTORSYS_API_KEY instead")
        api_key = args.engine_api_key or os.environ.get("ACTORSYS_API_KEY") or None

        def attached(_checkpoint: Any) -> AbstractAsyncContextManager[Any]:
            return attached_fleets(args.engine_url, fleets=count, flavor=args.flavor,
                                   api_key=api_key)

        return attached
    engines = args.engines or 1
    count = args.fleets or 1
    if count > engines:
        parser.error(f"argument --fleets: {count} > --engines {engines}; pass at most one fleet per engine")
    if args.flavor == "vllm" and vllm_missing():
        parser.error(f"argument --flavor: vllm needs {vllm_missing()}; run scripts/setup_vllm.sh")
    log_dir = os.path.join(os.path.abspath(args.out), "logs")
    return partial(started_fleets, engines=engines, fleets=count, flavor=args.flavor, log_dir=log_dir)


class PrintSink:
    """Prints each settled point on stdout, one line."""

    def record(self, outcome: Outcome) -> None:
        if outcome.ok:
            scores = " ".join(
                f"{k}={v:.4g}" for k, v in outcome.metrics.items() if k.count("/") == 1
                and k not in ("eval/lag_steps",) and not k.endswith("_seconds")
            )
            print(f"step {outcome.step}: ok {scores}", flush=True)
        else:
            from actorsys.watch.service import error_of

            error = error_of(outcome)
            why = outcome.reason if error is None else f"{outcome.reason}: {one_line(error)}"
            print(f"step {outcome.step}: {outcome.status} ({why})", flush=True)

    def close(self) -> None:
        """Nothing to release."""


def one_line(text: str, limit: int = 300) -> str:
    """``text``'s first line, cut to ``limit`` characters."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _sinks(args: argparse.Namespace) -> Any:
    from actorsys.sinks.fanout import FanoutSink

    sinks: list[Any] = [PrintSink()]
    if args.tensorboard:
        from actorsys.sinks.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(args.tensorboard))
    if args.wandb_project:
        from actorsys.sinks.wandb import WandbSink

        sinks.append(WandbSink(project=args.wandb_project, job_type="eval"))
    return FanoutSink(sinks)
