"""How fast is `onnxlens sweep`? The three targets of issue 15, each the whole command as a
subprocess (interpreter start, Ray start-up and the report included):

(a) 10 torchvision models x batch 1, 8, 32 x fp32, fp16 x host, a100, h100 = 180 estimate
    rows with the local engine: under 60 s;
(b) the same sweep with the Ray engine (a local Ray instance it starts): at most 1.5x (a);
(c) (a) again into the same directory, every row done: under 5 s.

    python benchmarks/sweep_speed.py            # exports the models once (cached) first
    python benchmarks/sweep_speed.py --address auto   # (b) against a Ray cluster already up
    python benchmarks/sweep_speed.py --timeline ray   # where one sweep's time goes

Runs (a), (b) alternately `--repeat` times (each into a fresh directory) and prints each time.
The set is the one of the first runs, kept so that figures compare across rounds
(regnet_y_400mf was left out then: its `host` estimate failed; it runs now).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from unittest import mock

MODELS = ["resnet50", "mobilenet_v3_large", "efficientnet_b0", "densenet121", "googlenet",
          "mnasnet1_0", "vit_b_16", "shufflenet_v2_x1_0", "squeezenet1_0",
          "convnext_tiny"]
SPEC = {"models": MODELS, "batch": [1, 8, 32], "precision": ["fp32", "fp16"],
        "hardware": ["host", "a100", "h100"]}


def _sweep(spec: Path, out: Path, engine: str, address: str | None = None
           ) -> tuple[float, int]:
    join = ["--address", address] if address and engine == "ray" else []
    start = time.perf_counter()
    done = subprocess.run(["onnxlens", "sweep", str(spec), "--out", str(out), "--engine", engine,
                           *join], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"sweep failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    rows = len((out / "results.jsonl").read_text().splitlines())
    return wall, rows


def _timeline(spec: Path, out: Path, engine: str) -> None:
    """One sweep in this process (no interpreter start, no CLI imports), its phases timed."""
    start = time.perf_counter()
    spans: list[tuple[float, float, str]] = []

    def timed(owner: object, name: str, label: str) -> AbstractContextManager[object]:
        call = getattr(owner, name)

        def run(*args: object, **kwargs: object) -> object:
            began = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spans.append((began - start, time.perf_counter() - start, label))

        return mock.patch.object(owner, name, run)

    import ray
    from ray._private import node, services, worker

    from onnxlens.sweep import driver, engines, load_spec, run_sweep

    spans.append((0.0, time.perf_counter() - start, "import ray, onnxlens.sweep"))
    phases = [(driver, "_plan", "plan: resolve and hash the models (a thread)"),
              (ray, "init", "ray.init"), (node.Node, "start_gcs_server", "  GCS"),
              (services, "get_node", "  raylet registered: Ray's get_node"),
              (worker, "connect", "  driver connects (waits for the prestarted workers)"),
              (engines, "run_ray", "tasks"), (engines, "run_local", "tasks"),
              (ray, "shutdown", "ray.shutdown"), (driver, "write_outputs", "csv, report")]
    with ExitStack() as stack:
        for owner, name, label in phases:
            stack.enter_context(timed(owner, name, label))
        run_sweep(load_spec(spec), out, engine=engine)
    for began, ended, label in sorted(spans):
        print(f"{began:5.2f} -> {ended:5.2f} s ({ended - began:4.2f})  {label}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--address", help="run (b) against this Ray cluster (started with one "
                        "onnxlens_timing_slot per node) instead of a local instance it starts")
    parser.add_argument("--timeline", choices=["local", "ray"], help="one sweep with this "
                        "engine in this process instead, its phases timed")
    args = parser.parse_args()
    from onnxlens.exporters.torch_export import cached_export

    for name in MODELS:  # exports are not what is measured
        cached_export(name)
    with tempfile.TemporaryDirectory(prefix="onnxlens-sweep-bench-") as tmp:
        spec = Path(tmp) / "spec.toml"
        spec.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in SPEC.items()))
        if args.timeline:
            return _timeline(spec, Path(tmp) / "out", args.timeline)
        times: dict[str, list[float]] = {"local": [], "ray": []}
        for i in range(args.repeat):
            for engine in times:
                out = Path(tmp) / f"{engine}{i}"
                wall, rows = _sweep(spec, out, engine, args.address)
                times[engine].append(wall)
                pair = (f" = {wall / times['local'][i]:.2f}x the local run before it"
                        if engine == "ray" else "")
                print(f"{engine}: {rows} rows in {wall:.1f} s{pair}", flush=True)
        resumed, rows = _sweep(spec, Path(tmp) / "local0", "local")
        shutil.rmtree(Path(tmp) / "ray0", ignore_errors=True)
    local, ray = min(times["local"]), min(times["ray"])
    # side by side, the pairs' ratios shift less with the load the others put on the machine
    pairs = statistics.median(
        r / lo for r, lo in zip(times["ray"], times["local"], strict=True))
    print(f"(a) local {local:.1f} s (target < 60 s)\n(b) ray {ray:.1f} s = {ray / local:.2f}x "
          f"local, best of each (median of the pairs {pairs:.2f}x; target <= 1.5x)\n"
          f"(c) resumed ({rows} rows done) {resumed:.1f} s (target < 5 s)")


if __name__ == "__main__":
    main()
