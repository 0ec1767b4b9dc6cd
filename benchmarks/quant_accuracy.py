"""How close is the calibrated `host` estimate to ONNX Runtime's measured CPU latency for models
quantized and converted to fp16 by ONNX Runtime's own tools (issue 14)?

    flock /tmp/bench.lock python benchmarks/quant_accuracy.py               # all models
    flock /tmp/bench.lock python benchmarks/quant_accuracy.py --models resnet18 --runs 10

Each model (torchvision's resnet18 and mobilenet_v2 at 224x224, BatchNorm folded, random
weights: `cached_export`; a BERT built from a config, `BERT` below, exported by TorchScript:
tests/hf_models.py) is made in these variants, into `--dir`:

- `fp32`: the export itself, the twin every other variant is checked against;
- `qdq`: `quantize_static`, QDQ format, uint8 activations and int8 weights per channel
  (QUInt8 / QInt8: ORT's x86 recommendation; ORT 1.31's default activation type is QInt8,
  which ORT runs mostly as float kernels between Q and DQ, `analyzer/runtimes/ort_cpu.py`);
- `qop`: `quantize_static`, QOperator format (QLinearConv, QLinearAdd, QGemm ...), same types;
- `qdq-s8`, `qop-s8`: the same with int8 activations, `quantize_static`'s default (QInt8): ORT
  on x86 fuses a QDQ Conv or MatMul only where its QDQS8ToU8Transformer turned the activations
  to uint8, and runs a QOperator QLinearConv / QLinearMatMul on int8 in MLAS's generic kernel;
- `dynamic`: `quantize_dynamic` (int8 weights, activations quantized to uint8 at run time);
- `fp16`: `onnxruntime.transformers.float16.convert_float_to_float16`, inputs and outputs
  kept float32 (`keep_io_types`).

Static quantization calibrates on two random inputs (`Feeds`): ranges do not change the
kernels ORT runs, only the numbers.

Every variant is estimated at the graph's own precision (`-H host`, the calibration of
`onnxlens calibrate` at `--threads`) and measured on ORT's CPU provider by
benchmarks/estimate_accuracy.py's helpers (`calibration`, `measure_rows`: estimate, naive
2 x MACs at the calibration's best GEMM rate, rounds of medians, the drift probe), then
summarized against issue 14's targets: every model within 25%, median within 10%. Each
quantized variant's MACs must equal its fp32 twin's within 1% (`MACS_TOLERANCE`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from estimate_accuracy import IMAGE_SIZE, calibration, measure_rows, summaries
from onnxruntime import quantization

import onnxlens
from onnxlens.analyzer.errors import OnnxLensError
from onnxlens.analyzer.hardware import ORT_CPU
from onnxlens.backends.ort_timing import make_session, random_feeds
from onnxlens.exporters.torch_export import cached_export

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import hf_models  # tests/: the tiny Hugging Face models built from configs

TORCHVISION = ("resnet18", "mobilenet_v2")
# BERT from a config: 4 layers, hidden 256 (16 heads of 16, MLP 512), 64 tokens.
BERT = {"layers": 4, "hidden": 256, "seq": 64}
VARIANTS = ("fp32", "qdq", "qop", "qdq-s8", "qop-s8", "dynamic", "fp16")
MACS_TOLERANCE = 0.01
TARGETS = {"within_25": 1.0, "median": 0.10}


class Feeds(quantization.CalibrationDataReader):
    """Two random input sets of any model (`random_feeds`: standard normal floats, small
    integers), for quantize_static's ranges."""

    def __init__(self, path: Path) -> None:
        session = make_session(path, 1)
        self.left = [random_feeds(session, seed=seed) for seed in (0, 1)]

    def get_next(self) -> dict[str, np.ndarray] | None:
        return self.left.pop() if self.left else None


def _static(fmt: quantization.QuantFormat, activations: quantization.QuantType
            ) -> Callable[[Path, Path], None]:
    def make(fp32: Path, out: Path) -> None:
        quantization.quantize_static(fp32, out, Feeds(fp32), quant_format=fmt,
                                     activation_type=activations,
                                     weight_type=quantization.QuantType.QInt8, per_channel=True)
    return make


def _dynamic(fp32: Path, out: Path) -> None:
    quantization.quantize_dynamic(fp32, out, weight_type=quantization.QuantType.QInt8)


def _fp16(fp32: Path, out: Path) -> None:
    """The converter appends its input Casts after the nodes reading them (ORT sorts a graph
    when it loads it; ONNX requires sorted nodes, and onnxlens refuses unsorted ones): sorted
    by onnx_ir before saving."""
    import onnx_ir
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx_ir.from_proto(convert_float_to_float16(onnx.load(fp32), keep_io_types=True))
    model.graph.sort()
    onnx.save(onnx_ir.to_proto(model), out)


_QDQ, _QOP = quantization.QuantFormat.QDQ, quantization.QuantFormat.QOperator
_U8, _S8 = quantization.QuantType.QUInt8, quantization.QuantType.QInt8
MAKE = {"qdq": _static(_QDQ, _U8), "qop": _static(_QOP, _U8), "qdq-s8": _static(_QDQ, _S8),
        "qop-s8": _static(_QOP, _S8), "dynamic": _dynamic, "fp16": _fp16}


def fp32_model(model: str, directory: Path) -> Path:
    if model in TORCHVISION:
        return cached_export(model, image_size=IMAGE_SIZE)
    path = directory / f"{model}-fp32.onnx"
    return path if path.is_file() else hf_models.export(model, path, dynamo=False, **BERT)


def variants(model: str, directory: Path, wanted: list[str]) -> dict[str, Path]:
    """`model`'s variants (name -> file), each made once into `directory`."""
    fp32 = fp32_model(model, directory)
    out = {}
    for variant in wanted:
        path = fp32 if variant == "fp32" else directory / f"{model}-{variant}.onnx"
        if not path.is_file():
            print(f"making {path.name} ...", file=sys.stderr, flush=True)
            MAKE[variant](fp32, path)
        out[f"{model} {variant}"] = path
    return out


def analysed_macs(paths: dict[str, Path]) -> dict[str, int]:
    """Each model's MACs; a model onnxlens refuses is printed with the reason and left out."""
    out = {}
    for name, path in paths.items():
        try:
            out[name] = onnxlens.analyze(path).total.macs
        except OnnxLensError as e:
            print(f"{name}: not analysed, left out: {e}")
    return out


def macs_check(macs: dict[str, int]) -> bool:
    """Each variant's MACs against its fp32 twin's (printed); True when all are within
    MACS_TOLERANCE."""
    ok = True
    for name, value in macs.items():
        model, variant = name.rsplit(" ", 1)
        twin = macs.get(f"{model} fp32")
        if variant == "fp32" or twin is None:
            continue
        off = value / twin - 1
        ok &= abs(off) <= MACS_TOLERANCE
        print(f"MACs {name:24s} {value:>14,d}  fp32 twin {twin:>14,d}  {off:+.3%}"
              + ("" if abs(off) <= MACS_TOLERANCE else "  OFF BY MORE THAN 1%"))
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of measurement (fastest kept)")
    ap.add_argument("--models", nargs="+", default=[*TORCHVISION, "bert"])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--dir", type=Path, default=Path("/tmp/onnxlens-quant-accuracy"),
                    help="where the quantized and fp16 models are made (kept between runs)")
    ap.add_argument("--recalibrate", action="store_true", help="measure this host again")
    ap.add_argument("--budget", type=float, default=100.0, help="calibration budget, seconds")
    ap.add_argument("--breakdown", action="store_true", help="estimated ms per op class")
    ap.add_argument("--measured-cache", type=Path,
                    help="JSON file of measured round medians to reuse and extend")
    args = ap.parse_args(argv)
    args.backend = ORT_CPU
    args.dir.mkdir(parents=True, exist_ok=True)

    paths = {name: path for model in args.models
             for name, path in variants(model, args.dir, args.variants).items()}
    macs = analysed_macs(paths)
    macs_ok = macs_check(macs)
    paths = {name: path for name, path in paths.items() if name in macs}
    cal = calibration(args.threads, args.recalibrate, args.budget, ORT_CPU)
    rows, _, _ = measure_rows(paths, cal, args)
    ours, _, _ = summaries(rows, TARGETS)
    met = {key: (ours[key] >= goal if key.startswith("within") else ours[key] <= goal)
           for key, goal in TARGETS.items()}
    print(f"every model within 25%: {'met' if met['within_25'] else 'NOT met'}; median <= 10%: "
          f"{'met' if met['median'] else 'NOT met'}; MACs equal the fp32 twin's within 1%: "
          f"{'yes' if macs_ok else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
