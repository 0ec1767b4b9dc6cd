"""Does `analyze` leave external weights on disk? Wall time and peak RSS against weight size.

    python benchmarks/external_weights.py                 # 8 GiB of external weights
    python benchmarks/external_weights.py --gib 1 --runs 1

A chain of 16 MatMuls, x[1, H] -> w0[H, 2H] -> w1[2H, H] -> ... (fp32), is written three
ways, each analyzed by the `analyze` command in a child process:

- big, external: H = 8192, 16 weights of 512 MiB = 8 GiB in `weights.bin`, written sparse
  (one byte at the end, the rest a hole: no disk used, and the values are zeros nobody reads);
- small, external: H = 256 (8 MiB), same layout: the cost of loading itself;
- small, in-file: H = 256, weights inside the .onnx (the cost when every byte is parsed).

Each child's wall time and peak RSS (its own `ru_maxrss`, from `os.wait4`) are printed side by
side, the median of `--runs`. Analysis reads no weight value, so the big model should cost about
what the small one does (target: under 2 s and 300 MB). Everything goes to a temporary folder,
removed at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper, numpy_helper

LAYERS = 16
SMALL_HIDDEN = 256


def chain_model(hidden: int, external: bool) -> onnx.ModelProto:
    """16 MatMuls alternating [H, 2H] and [2H, H]; weights external (laid out back to back in
    weights.bin, offsets and lengths set) or inline (random)."""
    import numpy as np

    rng = np.random.default_rng(0)
    nodes, weights, offset = [], [], 0
    for i in range(LAYERS):
        shape = (hidden, 2 * hidden) if i % 2 == 0 else (2 * hidden, hidden)
        name = f"w{i}"
        if external:
            length = math.prod(shape) * 4
            w = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape,
                            data_location=TensorProto.EXTERNAL)
            for key, value in (("location", "weights.bin"), ("offset", str(offset)),
                               ("length", str(length))):
                w.external_data.add(key=key, value=value)
            offset += length
        else:
            w = numpy_helper.from_array(rng.standard_normal(shape, dtype=np.float32), name)
        weights.append(w)
        nodes.append(helper.make_node("MatMul", [f"h{i}", name], [f"h{i + 1}"], name=f"mm{i}"))
    nodes[0].input[0] = "x"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "external_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                   [1, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, hidden])], weights)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def weight_bytes(hidden: int) -> int:
    return LAYERS * hidden * 2 * hidden * 4


def write_model(folder: Path, hidden: int, external: bool) -> Path:
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save(chain_model(hidden, external), path)
    if external:
        with (folder / "weights.bin").open("wb") as f:  # sparse: one byte at the end
            f.seek(weight_bytes(hidden) - 1)
            f.write(b"\0")
    return path


def analyze_once(path: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS bytes of one `analyze PATH` child."""
    command = [sys.executable, "-c", "from onnxlens.cli import analyze_main; analyze_main()",
               str(path), "--json", os.devnull]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    err = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"analyze {path} failed ({child.returncode}): {err.strip()}")
    return wall, usage.ru_maxrss * 1024  # Linux: kilobytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=8.0,
                        help="external weights of the big model, GiB (default 8)")
    parser.add_argument("--runs", type=int, default=3, help="runs per model (median)")
    args = parser.parse_args()
    # 16 · 2H² · 4 bytes = gib · 2**30  ->  H = sqrt(gib · 2**30 / 128)
    big = int(math.sqrt(args.gib * 2**30 / 128))
    tmp = Path(tempfile.mkdtemp(prefix="onnxlens-external-"))
    try:
        cases = [("big, external", write_model(tmp / "big", big, True), big),
                 ("small, external", write_model(tmp / "small_ext", SMALL_HIDDEN, True),
                  SMALL_HIDDEN),
                 ("small, in-file", write_model(tmp / "small_in", SMALL_HIDDEN, False),
                  SMALL_HIDDEN)]
        print(f"{'model':<16} {'H':>6} {'weights':>11} {'.onnx':>10} {'wall s':>7} "
              f"{'peak RSS MB':>11}")
        for label, path, hidden in cases:
            runs = [analyze_once(path) for _ in range(args.runs)]
            wall = statistics.median(w for w, _ in runs)
            rss = statistics.median(r for _, r in runs)
            print(f"{label:<16} {hidden:>6} {weight_bytes(hidden) / 2**30:>7.3f} GiB "
                  f"{path.stat().st_size / 2**20:>6.2f} MiB {wall:>7.2f} {rss / 1e6:>11.0f}")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
