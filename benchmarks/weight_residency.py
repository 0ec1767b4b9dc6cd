"""Where ORT's CPU kernels re-read a network's weights from, one run after the last: the rate of
GEMV chains' weight fetch, as `backends.calibrate.measure.cold_weight_gbps` measures its Conv
chains (a weight per layer against all layers sharing one; the extra time of the distinct
weights is their fetch), by total weight size and by what the run moves besides them.

    flock /tmp/bench.lock python benchmarks/weight_residency.py                # chains of 2-128 MB
    flock /tmp/bench.lock python benchmarks/weight_residency.py --beside 4 16 --stage-mb 1

`--beside A ...`: 8 MB of GEMVs beside elementwise stages moving A MB in all (fresh buffers,
one Relu, unless `--stage-mb` cuts it into Relu / Neg stages of that size, which ORT's arena
runs through a few reused buffers). One thread, the fastest of three 0.1 s medians each.
What it found and what the estimator makes of it: BENCHMARKS.md, "Weights a small network
re-reads from the last-level cache"; `HardwareProfile.weights_level`.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxlens.backends.calibrate.measure import prepare_ort

WIDTH = 512  # [1, 512] x [512, 512]: 1 MiB of weights a layer
MIB = 1024 * 1024


def gemv_chain(layers: int, shared: bool, beside_mb: float = 0.0,
               stage_mb: float | None = None) -> onnx.ModelProto:
    """`layers` GEMVs, each with a weight of its own or all sharing one, and an elementwise
    branch that moves `beside_mb` MB (read plus written), in stages of `stage_mb` MB moved."""
    rng = np.random.default_rng(0)
    row = [1, WIDTH]
    nodes, weights, x = [], [], "X"
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, row)]
    for i in range(layers):
        w = "W0" if shared else f"W{i}"
        if i == 0 or not shared:
            weights.append(numpy_helper.from_array(
                rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) * 0.03, w))
        nodes.append(helper.make_node("MatMul", [x, w], [f"Y{i}"]))
        x = f"Y{i}"
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, row)]
    if beside_mb:
        stage = stage_mb or beside_mb
        n, a = int(stage / 2 * MIB / 4), "A"  # a stage reads and writes n floats
        inputs.append(helper.make_tensor_value_info("A", TensorProto.FLOAT, [n]))
        for j in range(max(1, round(beside_mb / stage))):  # alternating: nothing to fuse
            nodes.append(helper.make_node("Neg" if j % 2 else "Relu", [a], [f"B{j}"]))
            a = f"B{j}"
        outputs.append(helper.make_tensor_value_info(a, TensorProto.FLOAT, [n]))
    graph = helper.make_graph(nodes, "weight_residency", inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def fetch_gbps(layers: int, beside_mb: float = 0.0, stage_mb: float | None = None
               ) -> tuple[float, float]:
    """The distinct chain's weight bytes over its time, and its extra weights (all but one
    layer's) over its extra time beyond the shared chain, in GB/s."""
    timers = {shared: prepare_ort(gemv_chain(layers, shared, beside_mb, stage_mb), 1)
              for shared in (True, False)}
    best = {shared: math.inf for shared in timers}
    for _ in range(3):  # alternating, as cold_weight_gbps does
        for shared, timer in timers.items():
            best[shared] = min(best[shared], timer(0.1))
    layer_bytes = WIDTH * WIDTH * 4
    extra_s = best[False] - best[True]
    return (layers * layer_bytes / best[False] / 1e9,
            (layers - 1) * layer_bytes / extra_s / 1e9 if extra_s > 0 else math.inf)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+",
                    default=[2, 4, 8, 12, 16, 24, 32, 48, 64, 128], help="MB of weights")
    ap.add_argument("--beside", type=float, nargs="+", help="MB moved beside 8 MB of GEMVs")
    ap.add_argument("--stage-mb", type=float, help="MB each elementwise stage moves")
    args = ap.parse_args()
    if args.beside:
        for mb in args.beside:
            _, extra = fetch_gbps(8, mb, args.stage_mb)
            print(f"8 MB of weights beside {mb:g} MB moved: 7 MB fetched at {extra:.1f} GB/s",
                  flush=True)
        return
    for mb in args.sizes:
        layers = max(2, round(mb * MIB / (WIDTH * WIDTH * 4)))
        whole, extra = fetch_gbps(layers)
        print(f"{layers} MB of weights: {whole:.1f} GB/s over the run, the extra "
              f"{layers - 1} MB at {extra:.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
