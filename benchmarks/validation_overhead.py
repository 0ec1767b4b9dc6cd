"""What does the validation layer cost? `analyze` with it and without it, side by side.

    python benchmarks/validation_overhead.py              # vit_b_16 and resnet50, 9 runs each
    python benchmarks/validation_overhead.py --runs 15 --chain 50000

For each model, runs alternate (with, without, with, ...) so that a drift in machine speed hits
both; each figure is the median, CPU time of the process beside wall time. "Without" replaces
`analyzer.validate.validate_model` by a stub that checks nothing; "in validation" is the time
spent inside the layer itself (`validate_model` before shape inference, `check_shapes` after)
during the runs with it, as a share of the whole `analyze`: the steadier figure of the two on a
shared machine. The target: under 5% on vit_b_16.

Models are torchvision's with random weights, exported once into --cache (BatchNorm folded,
1x3x224x224); `--chain N` adds a generated chain of N Conv/Relu/Add nodes (the worst case:
one Conv in three nodes).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnxlens
from onnxlens.analyzer import loader, validate

CACHE = Path.home() / ".cache" / "onnxlens" / "benchmarks"


def torchvision_file(name: str, cache: Path) -> Path:
    """`name` exported once (the MHA fast path off, which the TorchScript exporter cannot
    trace in vit_b_16)."""
    path = cache / f"{name}.onnx"
    if not path.exists():
        import torch
        import torchvision

        from onnxlens.exporters.torch_export import export_module

        cache.mkdir(parents=True, exist_ok=True)
        print(f"exporting {name} to {path} (once) ...", flush=True)
        enabled = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            export_module(torchvision.models.get_model(name, weights=None),
                          (torch.randn(1, 3, 224, 224),), path)
        finally:
            torch.backends.mha.set_fastpath_enabled(enabled)
    return path


def chain_file(nodes: int, cache: Path) -> Path:
    """Blocks x -> Conv3x3(w, b) -> Relu -> Add(x, .) of 8 channels on 8x8, weights each."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path = cache / f"chain{nodes}.onnx"
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    shape, x = [1, 8, 8, 8], "input"
    graph_nodes, inits = [], []
    for b in range(max(1, nodes // 3)):
        inits += [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3), np.float32), f"w{b}"),
                  numpy_helper.from_array(np.zeros(8, np.float32), f"b{b}")]
        graph_nodes += [helper.make_node("Conv", [x, f"w{b}", f"b{b}"], [f"c{b}"], name=f"conv{b}",
                                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", [f"c{b}"], [f"r{b}"], name=f"relu{b}"),
                        helper.make_node("Add", [x, f"r{b}"], [f"a{b}"], name=f"add{b}")]
        x = f"a{b}"
    graph = helper.make_graph(graph_nodes, "chain", [helper.make_tensor_value_info(
        "input", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
        x, TensorProto.FLOAT, shape)], inits)
    cache.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


class _Clock:
    """Time spent inside the validation layer (both passes), summed until read."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, validate_model: Callable[..., validate.Validation]
             ) -> Callable[..., validate.Validation]:
        def timed(proto: Any, **options: Any) -> validate.Validation:
            start = time.process_time()
            validation = validate_model(proto, **options)
            self.seconds += time.process_time() - start
            check_shapes = validation.check_shapes

            def timed_check(tensors: Any) -> None:
                start = time.process_time()
                check_shapes(tensors)
                self.seconds += time.process_time() - start

            validation.check_shapes = timed_check  # type: ignore[method-assign]
            return validation

        return timed


@contextmanager
def validation(on: bool, clock: _Clock) -> Iterator[None]:
    real = loader.validate_model
    loader.validate_model = (clock.wrap(real) if on else
                             lambda proto, *, limits, **_: validate.Validation(limits))
    try:
        yield
    finally:
        loader.validate_model = real


def measure(path: Path, runs: int) -> dict[str, float]:
    walls: dict[bool, list[float]] = {True: [], False: []}
    cpus: dict[bool, list[float]] = {True: [], False: []}
    inside: list[float] = []
    for on in (True, False):  # warm-up: imports, ORT's symbolic inference module
        with validation(on, _Clock()):
            onnxlens.analyze(path)
    for _ in range(runs):
        for on in (True, False):
            clock = _Clock()
            gc.collect()
            with validation(on, clock):
                wall, cpu = time.perf_counter(), time.process_time()
                onnxlens.analyze(path)
                walls[on].append(time.perf_counter() - wall)
                cpus[on].append(time.process_time() - cpu)
            if on:
                inside.append(clock.seconds / cpus[on][-1])
    med = {k: statistics.median(v) for k, v in (("wall_with", walls[True]),
                                                ("wall_without", walls[False]),
                                                ("cpu_with", cpus[True]),
                                                ("cpu_without", cpus[False]))}
    return {**med, "ratio_wall": med["wall_with"] / med["wall_without"],
            "ratio_cpu": med["cpu_with"] / med["cpu_without"],
            "share": statistics.median(inside)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="vit_b_16,resnet50")
    parser.add_argument("--chain", type=int, default=0, help="also a generated chain of N nodes")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args()
    paths = {name: torchvision_file(name, args.cache) for name in args.models.split(",") if name}
    if args.chain:
        paths[f"chain {args.chain:,}"] = chain_file(args.chain, args.cache)
    print(f"{'model':<14}{'with (s)':>10}{'without':>10}{'ratio':>8}"
          f"{'cpu with':>10}{'cpu w/o':>10}{'ratio':>8}{'in validation':>15}")
    for name, path in paths.items():
        m = measure(path, args.runs)
        print(f"{name:<14}{m['wall_with']:>10.3f}{m['wall_without']:>10.3f}"
              f"{m['ratio_wall']:>8.3f}{m['cpu_with']:>10.3f}{m['cpu_without']:>10.3f}"
              f"{m['ratio_cpu']:>8.3f}{100 * m['share']:>14.2f}%", flush=True)


if __name__ == "__main__":
    main()
