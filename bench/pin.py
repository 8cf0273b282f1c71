"""Pin latency of the embedded fleet, what the weight probe adds to it, and where the time
from submit to eval start goes.

Run: ``.venv/bin/python bench/pin.py [--hidden 512 --layers 8 --repeats 5] [--vllm]``

1. Pin one engine, then four engines loading in parallel, to the same snapshots (alternating
   between two, so every pin loads new weights), with the weight probe off and on in turn.
   A pin is timed until the evaluation may start (``Fleet.pin_and_verify``'s start returns:
   the version read back and, with the probe, the engines' answers in); the verdict, which
   waits for the snapshot's reference, is timed separately, as are the engines' own answers
   to the probe (asked alone, right after). Prints the medians side by side, what the probe
   adds beyond the engines' own time to answer it (goal: about nothing), and the 4 / 1
   engine ratio. With ``--vllm``, the same for one vLLM server (from ``.venv-vllm``, tied
   embeddings, as the local fleet launches it).
2. The memory a reference costs where it is computed (the reference worker, never the
   trainer's process; ``bench/trainer_cost.py`` samples the worker itself): the snapshot
   loaded as the worker loads it, anonymous memory (a copy) against file-backed memory (the
   mapped safetensors), measured here in this process.
3. Submit points through EvalSupervisor (export from a model in memory) to a fleet of one and
   of four engines and splits the time from submit to the eval fn's start into the time
   submit blocks the caller (the weight copy), export, pin (probe included), and the rest
   (hand-offs between actors); the four add up to the total.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
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
from actorsys.fleet.local import LocalFleet, embedded  # noqa: E402
from actorsys.fleet.pin.probe import PrefillAnswer, WeightProbe, probe_prompts, read_probe_prompts
from actorsys.fleet.pin.reference import ReferenceWorker  # noqa: E402
from tests.models import make_model, make_snapshot, random_model  # noqa: E402

VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


class StartStamp(CheckpointEvalFn):
    """Records when each evaluation starts; scores nothing."""

    def __init__(self) -> None:
        self.started: dict[int, float] = {}

    async def evaluate_checkpoint(
        self, checkpoint_dir: str, input: RolloutFnEvalInput
    ) -> RolloutFnEvalOutput:
        self.started[input.rollout_id] = trio.current_time()
        return RolloutFnEvalOutput(data={})


async def pin_times(
    fleet: Fleet, snapshots: list[str], repeats: int
) -> dict[str, list[float]]:
    """Pin times with the probe off and on, interleaved so that noise hits both alike: until
    the evaluation may start (``off``, ``on``), until the verdict (``verdict``), and the
    engines' own time to answer the probe, asked alone after a pin (``answer``)."""
    times: dict[str, list[float]] = {"off": [], "on": [], "verdict": [], "answer": []}
    probe = WeightProbe()
    count = 0
    for _ in range(repeats):
        for probed in (False, True):
            snapshot = snapshots[count % 2]
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                verdict = await nursery.start(
                    functools.partial(fleet.pin_and_verify, snapshot, f"bench-{count}",
                                      probe=probed)
                )
                pinned = trio.current_time()
                await verdict.wait()
            judged = trio.current_time()
            times["on" if probed else "off"].append(pinned - started)
            if probed:
                times["verdict"].append(judged - started)
                prompts = read_probe_prompts(snapshot)
                asked = trio.current_time()
                answers = await probe.ask(probe.probed(fleet.engines), prompts)
                times["answer"].append(trio.current_time() - asked)
                kinds = {"prefill" if isinstance(a, PrefillAnswer) else "greedy" for a in answers}
                times.setdefault("kinds", []).extend(kinds)  # type: ignore[arg-type]
            count += 1
    return times


def print_pin_table(rows: list[tuple[str, dict[str, list[float]]]]) -> None:
    print("| pin, until the eval may start | probe off, median s | probe on, median s "
          "| on / off | engines answer the probe, ms | the probe adds beyond that, ms "
          "| verdict after, s | probe |")
    print("|---|---|---|---|---|---|---|---|")
    for label, times in rows:
        off, on = median(times["off"]), median(times["on"])
        answer, verdict = median(times["answer"]), median(times["verdict"])
        kinds = "/".join(sorted(set(times.get("kinds", [])))) or "-"  # type: ignore[arg-type]
        print(f"| {label} | {off:.3f} | {on:.3f} | {on / off:.2f} | {1000 * answer:.0f} "
              f"| {1000 * (on - off - answer):.0f} | {verdict:.3f} | {kinds} |")


async def reference_times(snapshots: list[str], repeats: int) -> list[float]:
    """The probe's reference alone, as a pin computes it (the reference worker, a process)."""
    worker = ReferenceWorker()
    times = []
    try:
        for index in range(repeats):
            path = snapshots[index % 2]
            started = trio.current_time()
            await worker.compute(path, read_probe_prompts(path))
            times.append(trio.current_time() - started)
    finally:
        await worker.aclose()
    return times


def memory_mb() -> dict[str, float]:
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) / 1024
    return values


def reference_memory(snapshot: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    before = memory_mb()
    model = AutoModelForCausalLM.from_pretrained(snapshot, dtype="auto")
    with torch.inference_mode():
        model(input_ids=torch.tensor(probe_prompts(model.config.vocab_size)), use_cache=False)
    loaded = memory_mb()
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    del model
    print("| reference model loaded as the probe loads it, after a forward | weights MB "
          "| anonymous MB added | file-backed MB added |")
    print("|---|---|---|---|")
    print(f"| {snapshot.rsplit('/', 1)[-1]} | {size:.0f} "
          f"| {loaded['RssAnon'] - before['RssAnon']:.0f} "
          f"| {loaded['RssFile'] - before['RssFile']:.0f} |\n")


async def vllm_pin_times(root: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    from actorsys.fleet.local import vllm

    make_model(root / "tied", seed=0, hidden=args.hidden, layers=args.layers, tied=True)
    snapshots = [str(root / "tied_a"), str(root / "tied_b")]
    for seed, path in enumerate(snapshots, start=1):
        make_snapshot(root / "tied", path, seed=seed)
    async with LocalFleet.open([vllm(str(root / "tied"), python=str(VLLM_PYTHON))],
                               startup_timeout=400) as local:
        await local.fleet.pin(snapshots[1], "warm")
        return await pin_times(local.fleet, snapshots, args.repeats)


async def submit_to_start(
    fleet: Fleet, base: Path, staging: Path, repeats: int
) -> list[dict[str, float]]:
    from transformers import LlamaConfig

    config = LlamaConfig.from_pretrained(base)
    models = [random_model(config, seed=1000 + i) for i in range(repeats)]
    eval_fn = StartStamp()
    sink = MemorySink()
    rows = []
    settings = EvalConfig(hf_dir=staging, base_checkpoint=base, max_in_flight=1, keep_snapshots=0)
    async with EvalSupervisor.open(settings, eval_fn=eval_fn, fleet=fleet, sink=sink) as sup:
        for step, model in enumerate(models, start=1):
            submitted = trio.current_time()
            await sup.submit(step, model=model)
            submit_returned = trio.current_time()
            await sup.drain(timeout=300)
            outcome = sink.by_step()[step]
            assert outcome.ok, outcome
            total = eval_fn.started[step] - submitted
            export = outcome.metrics["eval/export_time_seconds"]
            pin = outcome.metrics["eval/pin_time_seconds"]
            blocked = submit_returned - submitted
            rows.append(
                {
                    "submit_blocks": blocked,
                    "export": export,
                    "pin": pin,
                    "other": total - blocked - export - pin,
                    "total": total,
                }
            )
    return rows


def median(values: list[float]) -> float:
    return statistics.median(values)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="actorsys-bench-") as tmp:
        root = Path(tmp)
        model = make_model(root / "base", seed=0, hidden=args.hidden, layers=args.layers)
        size = sum(p.numel() * p.element_size() for p in model.state_dict().values())
        del model
        snapshots = [str(root / "snap_a"), str(root / "snap_b")]
        for seed, path in enumerate(snapshots, start=1):
            make_snapshot(root / "base", path, seed=seed)
        print(f"model: hidden {args.hidden}, {args.layers} layers, {size / 1e6:.0f} MB fp32; "
              f"{os.cpu_count()} cores; {args.repeats} repeats, medians\n")
        specs = [embedded(str(root / "base"), threads=1) for _ in range(4)]
        wall = time.monotonic()
        async with LocalFleet.open(specs, startup_timeout=300) as local:
            print(f"4 engines healthy after {time.monotonic() - wall:.1f} s\n")
            one = Fleet([local.engines[0].client])
            four = local.fleet
            await one.pin(snapshots[1], "warm")
            await four.pin(snapshots[1], "warm")
            t1 = await pin_times(one, snapshots, args.repeats)
            t4 = await pin_times(four, snapshots, args.repeats)
            rows = [("1 embedded engine", t1), ("4 embedded engines, parallel loads", t4)]
            if args.vllm:
                rows.append(("1 vLLM server, tied embeddings", await vllm_pin_times(root, args)))
            print_pin_table(rows)
            alone = await reference_times(snapshots, args.repeats)
            print(f"\nthe snapshot's reference alone (runs while the engines load): median "
                  f"{median(alone):.3f} s, min {min(alone):.3f} s")
            ratio = median(t4["on"]) / median(t1["on"])
            print(f"\nratio 4 engines / 1 engine (probe on): {ratio:.2f}\n")
            reference_memory(snapshots[0])
            print("| submit -> eval start, mean s | submit blocks | export | pin | other | total |")
            print("|---|---|---|---|---|---|")
            for label, fleet in (("1 engine", one), ("4 engines", four)):
                staging = root / f"staging-{label[0]}"
                rows = await submit_to_start(fleet, root / "base", staging, args.repeats)
                cells = " | ".join(
                    f"{statistics.mean([r[key] for r in rows]):.3f}"
                    for key in ("submit_blocks", "export", "pin", "other", "total")
                )
                print(f"| {label} | {cells} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vllm", action="store_true", help="also pin one vLLM server")
    trio.run(main, parser.parse_args())
