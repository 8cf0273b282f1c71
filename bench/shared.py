"""Shared mode, side by side: what evaluating on the trainer's own rollout engines costs the
trainer, its rollouts and its weight updates, and what the probe adds to a pin.

Run: ``.venv/bin/python bench/shared.py [--parts stall,rollouts,update,pin] [--vllm]``
(about five minutes on 2 cores; every figure is a ratio of two things measured in the same run,
interleaved, medians over ``--reps``). Real torch models, real CPU engine processes on loopback
(``python -m actorsys engine``, as :class:`LocalFleet` starts them), vLLM with ``--vllm``.

1. ``stall``: the time ``submit(step, served=True)`` blocks the trainer, against
   ``submit(step, model=...)`` of a model of ``--stall-hidden``/``--stall-layers`` (its weight
   copy), alternating. Goal: at most 0.01.
2. ``rollouts``: a trainer's rollouts (one thread, requests of ``--rollout-batch`` prompts of
   ``--tokens`` tokens each, one after another) on one CPU engine serving a model of
   ``--hidden``/``--layers``, in windows of ``--window`` seconds: alone, while a served point's
   evaluation (``fleet.complete(..., concurrency=4)``) runs on the engine, and the same with
   ``Fleet(eval_priority=1)``. Rollout tokens/s with an evaluation / alone. Goal: at least 0.7.
3. ``update``: how long ``async with sup.weight_update()`` waits on entry while an evaluation
   runs, under ``shared_update="wait"`` and ``"preempt"``, against the evaluation's length
   (measured alone). Goal: "preempt" enters within 0.5 s.
4. ``pin``: the time from a pin's start until the eval fn is called, probe on / probe off
   (``EvalConfig(probe=)``): a dedicated fleet of one engine (``submit(step,
   checkpoint_dir=...)``, each point another snapshot, so every pin loads new weights) and a
   shared fleet of two engines (served, so the agreement probe runs), on the CPU engine; with
   ``--vllm`` the dedicated pin on one vLLM server too. A ``checkpoint_dir`` or ``served``
   point has no export, so its pin starts when ``submit`` returns; the table also gives the
   pin stage's own time (``eval/pin_time_seconds``: until every engine reads the version
   back). Goal: at most 1.15.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorsys import (  # noqa: E402
    CheckpointEvalFn,
    EvalConfig,
    EvalSupervisor,
    Fleet,
    MemorySink,
    RolloutFnEvalInput,
    RolloutFnEvalOutput,
)
from actorsys.fleet.local import LocalFleet, embedded, vllm  # noqa: E402
from actorsys.fleet.protocol import Engine  # noqa: E402
from tests.fleet.rollouts import Rollouts  # noqa: E402
from tests.models import make_model, make_snapshot  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = next(
    (p for p in (ROOT / ".venv-vllm" / "bin" / "python",
                 Path(sys.prefix).parent / ".venv-vllm" / "bin" / "python") if p.exists()),
    ROOT / ".venv-vllm" / "bin" / "python",
)
PROMPTS = ["the quick brown", "engines load", "one two three", "a trainer hands"]
MB = 1000**2


def median(values: list[float]) -> float:
    return statistics.median(values)


def model_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) / MB


class Stamped(CheckpointEvalFn):
    """Records when each evaluation starts and ends; completes ``prompts`` on the pinned fleet
    with concurrency 4 (none: scores nothing), until done or until ``stop`` is called."""

    def __init__(self, prompts: list[str] | None = None, tokens: int = 32) -> None:
        self.prompts, self.tokens = prompts, tokens
        self.started: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.running = trio.Event()
        self._scope: trio.CancelScope | None = None

    async def evaluate_checkpoint(
        self, checkpoint_dir: str | None, input: RolloutFnEvalInput  # type: ignore[override]
    ) -> RolloutFnEvalOutput:
        self.started[input.rollout_id] = trio.current_time()
        if self.prompts is not None:
            assert input.fleet is not None
            with trio.CancelScope() as self._scope:
                self.running.set()
                await input.fleet.complete(self.prompts, max_tokens=self.tokens, concurrency=4,
                                           extra={"ignore_eos": True}, request_timeout=600)
        self.ended[input.rollout_id] = trio.current_time()
        return RolloutFnEvalOutput(data={})

    def stop(self) -> None:
        assert self._scope is not None
        self._scope.cancel()

    def reset(self) -> None:
        self.running = trio.Event()


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


async def stall(engine: Engine, root: Path, args: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=32000, hidden_size=args.stall_hidden, intermediate_size=args.stall_hidden * 8 // 3,
        num_hidden_layers=args.stall_layers, num_attention_heads=args.stall_hidden // 64,
        num_key_value_heads=args.stall_hidden // 64, tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    await engine.load_weights(str(root / "rollout"), "stall")
    times: dict[str, list[float]] = {"dense": [], "served": []}
    dense_config = EvalConfig(hf_dir=root / "stall-staging", max_in_flight=2, keep_snapshots=0)
    served_config = EvalConfig(base_checkpoint=root / "rollout", probe=False)
    async with (
        EvalSupervisor.open(dense_config, eval_fn=Stamped(), sink=MemorySink()) as dense,
        EvalSupervisor.open(served_config, eval_fn=Stamped(), sink=MemorySink(),
                            fleet=Fleet([engine], shared=True)) as served,
    ):
        await dense.prepare(model=model)
        for step in range(args.reps + 1):
            took_dense = await timed(lambda step=step: dense.submit(step, model=model))
            await dense.drain(timeout=300)
            took_served = await timed(lambda step=step: served.submit(step, served="stall"))
            await served.drain(timeout=300)
            if step:  # the first round warms up
                times["dense"].append(took_dense)
                times["served"].append(took_served)
    dense_s, served_s = median(times["dense"]), median(times["served"])
    print(f"\n## 1. trainer stall per submit (model {nbytes / MB:.0f} MB fp32, hidden "
          f"{args.stall_hidden}, {args.stall_layers} layers; {args.reps} reps, medians)")
    print("| submit | blocks the trainer, ms | all reps, ms |")
    print("|---|---|---|")
    for name, label in (("dense", "submit(step, model=...)"), ("served", "submit(step, served=...)")):
        cells = ", ".join(f"{1000 * t:.2f}" for t in times[name])
        print(f"| {label} | {1000 * median(times[name]):.3f} | {cells} |")
    print(f"ratio served / dense: {served_s / dense_s:.4f} (goal <= 0.01)")


async def rollouts(engine: Engine, root: Path, args: argparse.Namespace) -> None:
    await engine.load_weights(str(root / "rollout"), "r")
    prompts = [PROMPTS[i % 4] + f" {i}" for i in range(args.eval_prompts)]
    config = EvalConfig(base_checkpoint=root / "rollout", probe=False, eval_timeout=3600)
    fns = {"eval": Stamped(prompts, args.tokens), "eval, eval_priority=1": Stamped(prompts, args.tokens)}
    fleets = {"eval": Fleet([engine], shared=True),
              "eval, eval_priority=1": Fleet([engine], shared=True, eval_priority=1)}
    rates: dict[str, list[float]] = {"alone": [], **{name: [] for name in fns}}
    url, key = getattr(engine, "url"), getattr(engine, "api_key", None)  # noqa: B009
    async with AsyncExitStack() as stack:
        sups = {name: await stack.enter_async_context(EvalSupervisor.open(
                    config, eval_fn=fns[name], fleet=fleets[name], sink=MemorySink()))
                for name in fns}
        body = {"prompt": [f"rollout {i}" for i in range(args.rollout_batch)],
                "max_tokens": args.tokens, "temperature": 1.0, "ignore_eos": True}
        tokens = args.rollout_batch * args.tokens  # a request's
        with Rollouts(url, key, body, timeout=600.0) as thread:
            await trio.sleep(args.window / 2)  # warm up
            step = 0
            for _ in range(args.reps):
                for name in rates:
                    if name != "alone":
                        step += 1
                        fns[name].reset()
                        await sups[name].submit(step, served="r")
                        await fns[name].running.wait()
                        await trio.sleep(0.5)  # the evaluation's requests reach the engine
                    start = time.perf_counter()
                    await trio.sleep(args.window)
                    rates[name].append(tokens * thread.rate(start, time.perf_counter()))
                    if name != "alone":
                        fns[name].stop()
                        await sups[name].drain(timeout=300)
                        await trio.sleep(2 * args.tokens * 0.05)  # the cut requests end
        assert not thread.failures, thread.failures[:3]
    model = f"hidden {args.hidden}, {args.layers} layers, {model_mb(root / 'rollout'):.0f} MB fp32"
    print(f"\n## 2. rollout tokens/s on one CPU engine ({model}, 1 torch thread, max batch 16; "
          f"rollouts: {args.rollout_batch} prompts x {args.tokens} tokens a request; eval: "
          f"concurrency 4, {args.tokens} tokens a prompt; {args.reps} windows of {args.window:g} s, "
          "interleaved, medians)")
    print("| rollouts | tokens/s | / alone | all windows |")
    print("|---|---|---|---|")
    alone = median(rates["alone"])
    for name, values in rates.items():
        cells = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {name} | {median(values):.0f} | {median(values) / alone:.2f} | {cells} |")
    print("goal: with an evaluation / alone >= 0.7")


async def update(engine: Engine, root: Path, args: argparse.Namespace) -> None:
    await engine.load_weights(str(root / "rollout"), "u")
    prompts = [PROMPTS[i % 4] + f" {i}" for i in range(args.update_prompts)]
    policies = ("alone", "wait", "preempt")
    fns = {name: Stamped(prompts, args.tokens) for name in policies}
    waits: dict[str, list[float]] = {name: [] for name in policies}
    sinks = {name: MemorySink() for name in policies}
    async with AsyncExitStack() as stack:
        sups = {}
        for name in policies:
            config = EvalConfig(base_checkpoint=root / "rollout", probe=False, eval_timeout=3600,
                                shared_update="preempt" if name == "preempt" else "wait")
            sups[name] = await stack.enter_async_context(EvalSupervisor.open(
                config, eval_fn=fns[name], fleet=Fleet([engine], shared=True), sink=sinks[name]))
        step = 0
        for _ in range(args.reps):
            for name in policies:
                step += 1
                fns[name].reset()
                await sups[name].submit(step, served="u")
                await fns[name].running.wait()
                if name == "alone":
                    await sups[name].drain(timeout=600)
                    waits[name].append(fns[name].ended[step] - fns[name].started[step])
                    continue
                await trio.sleep(args.update_after)
                entered = trio.current_time()
                async with sups[name].weight_update():
                    waits[name].append(trio.current_time() - entered)
                await sups[name].drain(timeout=600)
                await trio.sleep(2 * args.tokens * 0.05)  # a cut evaluation's requests end
    outcomes = {name: [o.reason or o.status for o in sinks[name].outcomes] for name in policies}
    length = median(waits["alone"])
    print(f"\n## 3. weight_update entry with an evaluation running (one CPU engine, "
          f"{model_mb(root / 'rollout'):.0f} MB model; the evaluation: {args.update_prompts} "
          f"prompts x {args.tokens} tokens, concurrency 4; the update enters "
          f"{args.update_after:g} s after it starts; {args.reps} reps, medians)")
    print("| | seconds | / evaluation's length | all reps, s | outcomes |")
    print("|---|---|---|---|---|")
    for name, label in (("alone", "evaluation's length (no update)"),
                        ("wait", 'entry wait, shared_update="wait"'),
                        ("preempt", 'entry wait, shared_update="preempt"')):
        cells = ", ".join(f"{v:.3f}" for v in waits[name])
        print(f"| {label} | {median(waits[name]):.3f} | {median(waits[name]) / length:.3f} "
              f"| {cells} | {', '.join(outcomes[name])} |")
    print('goal: "preempt" entry <= 0.5 s')


async def pin_rows(
    kind: str, fleets: dict[bool, Fleet], root: Path, base: Path, snapshots: list[Path],
    reps: int,
) -> dict[bool, dict[str, list[float]]]:
    """Per probe setting: ``start`` (submit returned until the eval fn is called) and ``pin``
    (``eval/pin_time_seconds``), probe off and on in turn."""
    rows: dict[bool, dict[str, list[float]]] = {p: {"start": [], "pin": []} for p in (False, True)}
    fns = {p: Stamped() for p in (False, True)}
    sinks = {p: MemorySink() for p in (False, True)}
    async with AsyncExitStack() as stack:
        sups = {}
        for probe in (False, True):
            config = EvalConfig(hf_dir=root / f"{kind}-{probe}", base_checkpoint=base,
                                probe=probe, keep_snapshots=0, pin_timeout=600)
            sups[probe] = await stack.enter_async_context(EvalSupervisor.open(
                config, eval_fn=fns[probe], fleet=fleets[probe], sink=sinks[probe]))
        step = 0
        for rep in range(reps + 1):
            for probe in (False, True):
                step += 1
                sup = sups[probe]
                snapshot = snapshots[step % len(snapshots)]
                if fleets[probe].shared:
                    async with sup.weight_update():  # the trainer's update, outside the timing
                        for engine in fleets[probe].engines:
                            await engine.load_weights(str(snapshot), f"v{step}")
                    submitted = trio.current_time()
                    await sup.submit(step, served=f"v{step}")
                else:
                    await sup.submit(step, checkpoint_dir=snapshot)
                    submitted = trio.current_time()
                await sup.drain(timeout=600)
                outcome = sinks[probe].by_step()[step]
                assert outcome.ok, (outcome.reason, outcome.data)
                if rep:  # the first round warms up (the reference worker starts)
                    rows[probe]["start"].append(fns[probe].started[step] - submitted)
                    rows[probe]["pin"].append(outcome.metrics["eval/pin_time_seconds"])
    return rows


def print_pin(label: str, rows: dict[bool, dict[str, list[float]]]) -> None:
    off, on = median(rows[False]["start"]), median(rows[True]["start"])
    pin_off, pin_on = median(rows[False]["pin"]), median(rows[True]["pin"])
    cells = "; ".join(", ".join(f"{v:.3f}" for v in rows[p]["start"]) for p in (False, True))
    print(f"| {label} | {off:.3f} | {on:.3f} | {on / off:.2f} | {pin_off:.3f} | {pin_on:.3f} "
          f"| {pin_on / pin_off:.2f} | {cells} |")


async def pins(local: LocalFleet, root: Path, args: argparse.Namespace) -> None:
    base = root / "pin"
    snapshots = [root / f"pin_{i}" for i in range(2)]
    one, two = local.engines[0].client, local.engines[1].client
    results = [("1 CPU engine, dedicated (checkpoint_dir)", await pin_rows(
        "dedicated", {p: Fleet([one]) for p in (False, True)}, root, base, snapshots, args.reps))]
    results.append(("2 CPU engines, shared (served, agreement probe)", await pin_rows(
        "shared", {p: Fleet([one, two], shared=True) for p in (False, True)}, root, base,
        snapshots, args.reps)))
    if args.vllm:
        vbase = root / "vpin"
        make_model(vbase, seed=0, hidden=args.pin_hidden, layers=args.pin_layers, tied=True)
        vsnaps = [root / f"vpin_{i}" for i in range(2)]
        for i, path in enumerate(vsnaps):
            make_snapshot(vbase, path, seed=10 + i)
        async with LocalFleet.open([vllm(str(vbase), python=str(VLLM_PYTHON))],
                                   startup_timeout=600) as served:
            (engine,) = [e.client for e in served.engines]
            results.append(("1 vLLM server, dedicated (checkpoint_dir)", await pin_rows(
                "vllm", {p: Fleet([engine]) for p in (False, True)}, root, vbase, vsnaps,
                args.reps)))
    print(f"\n## 4. pin until the eval fn is called, probe on / off (model hidden "
          f"{args.pin_hidden}, {args.pin_layers} layers, {model_mb(base):.0f} MB fp32; "
          f"{args.reps} reps, alternating, medians)")
    print("| fleet | probe off, s | probe on, s | on / off | pin stage off, s | pin stage on, s "
          "| on / off | all reps off; on, s |")
    print("|---|---|---|---|---|---|---|---|")
    for label, rows in results:
        print_pin(label, rows)
    print("goal: on / off <= 1.15")


async def main(args: argparse.Namespace) -> None:
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory(prefix="actorsys-bench-") as tmp:
        root = Path(tmp)
        print(f"{os.cpu_count()} cores; parts: {args.parts}")
        make_model(root / "rollout", seed=0, hidden=args.hidden, layers=args.layers)
        if "pin" in parts:
            make_model(root / "pin", seed=0, hidden=args.pin_hidden, layers=args.pin_layers)
            for i in range(2):
                make_snapshot(root / "pin", root / f"pin_{i}", seed=1 + i)
        if parts & {"stall", "rollouts", "update"}:
            async with LocalFleet.open([embedded(str(root / "rollout"), threads=1)],
                                       startup_timeout=300) as local:
                engine = local.engines[0].client
                if "stall" in parts:
                    await stall(engine, root, args)
                if "rollouts" in parts:
                    await rollouts(engine, root, args)
                if "update" in parts:
                    await update(engine, root, args)
        if "pin" in parts:
            specs = [embedded(str(root / "pin"), threads=1) for _ in range(2)]
            async with LocalFleet.open(specs, startup_timeout=300) as local:
                await pins(local, root, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="stall,rollouts,update,pin",
                        help="comma-separated: stall, rollouts, update, pin")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--stall-hidden", type=int, default=768)
    parser.add_argument("--stall-layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024, help="the rollout engine's model")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="tokens a rollout / eval prompt")
    parser.add_argument("--rollout-batch", type=int, default=8, help="prompts a rollout request")
    parser.add_argument("--window", type=float, default=10.0, help="seconds a rollout window")
    parser.add_argument("--eval-prompts", type=int, default=2000,
                        help="an evaluation's prompts in part 2 (it is stopped after a window)")
    parser.add_argument("--update-prompts", type=int, default=24,
                        help="an evaluation's prompts in part 3")
    parser.add_argument("--update-after", type=float, default=1.0,
                        help="seconds into the evaluation the update enters")
    parser.add_argument("--pin-hidden", type=int, default=512)
    parser.add_argument("--pin-layers", type=int, default=8)
    parser.add_argument("--vllm", action="store_true", help="also pin one vLLM server")
    trio.run(main, parser.parse_args())
