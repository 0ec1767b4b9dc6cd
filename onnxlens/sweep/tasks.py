"""What a sweep worker does, the same under both engines: module-level functions of plain
values, so a process pool pickles them and Ray ships them.

- `analyze_task`: one model at one batch, analyzed once; its estimate rows for every
  (precision, hardware) through `analyzer.sweep.sweep_rows`, and the model's figures that
  its measured rows carry too.
- `measure_task`: one model at one batch timed on one backend, at the model's own precision.

Neither raises for a bad model or a backend that cannot run: the row says `error` and why.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The fields of a results.jsonl row, in order (README "Sweeps and clusters").
ROW_FIELDS = ("model", "model_sha256", "batch", "precision", "target", "kind", "latency_s",
              "throughput_per_s", "energy_j", "macs", "flops", "params",
              "activation_peak_bytes", "peak_memory_bytes", "host", "onnxlens_version",
              "status", "error")
STAT_FIELDS = ("macs", "flops", "params", "activation_peak_bytes")

Source = Path | bytes  # a path on the machine that runs the task, or the model's bytes


@dataclass(frozen=True)
class RowId:
    """Which model at which batch a task is about (what every row it makes repeats)."""

    model: str  # as the spec names it
    model_sha256: str | None  # None when the model could not even be read
    batch: int
    dims: Mapping[str, int] = field(default_factory=dict)  # symbolic input dims pinned


def model_sha256(path: Path) -> str:
    """The file's SHA-256, read a MiB at a time: hashing the whole file's bytes read at once
    costs a fresh buffer of the model's size (0.7 GB for ten torchvision models: 1.0-1.1 s
    against 0.65-0.8 s in chunks, on a loaded two-core Zen 5)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(functools.partial(f.read, 1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def row_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes a row unique, for resuming. A measured row's precision is the model's own,
    a function of its hash: it is left out so that the key is known before any analysis."""
    precision = row["precision"] if row["kind"] == "estimate" else ""
    return row["model_sha256"], row["batch"], precision, row["target"], row["kind"]


def make_row(rid: RowId, precision: str, target: str, kind: str, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(ROW_FIELDS)
    row.update(model=rid.model, model_sha256=rid.model_sha256, batch=rid.batch,
               precision=precision, target=target, kind=kind, host=dict(host_facts()),
               onnxlens_version=_version(), status="ok")
    row.update(values)
    return row


def error_row(rid: RowId, precision: str, target: str, kind: str, why: str,
              **values: Any) -> dict[str, Any]:
    return make_row(rid, precision, target, kind, status="error", error=why, **values)


def one_line(e: BaseException) -> str:
    """An error as one line: onnxlens's own errors by their message, others by type too."""
    from ..analyzer.errors import OnnxLensError

    text = str(e) if isinstance(e, OnnxLensError) else f"{type(e).__name__}: {e}"
    text = " ".join(text.split())
    return text[:497] + "..." if len(text) > 500 else text


@functools.cache
def host_facts() -> dict[str, str]:
    """The machine a row ran on: its name, CPU model and vector ISA."""
    from ..analyzer.host import detect_cpu

    cpu = detect_cpu()
    return {"name": socket.gethostname(), "cpu": cpu.model, "isa": cpu.simd}


def _version() -> str:
    from .. import __version__

    return __version__


def analyze_task(rid: RowId, source: Source, precisions: Sequence[str],
                 hardware: Sequence[str], threads: int
                 ) -> tuple[dict[str, Any] | None, str | None, list[dict[str, Any]]]:
    """(the model's figures at this batch, or None and why when it failed; its estimate rows).

    One analysis serves every (precision, hardware) row: `sweep_rows` estimates each from it."""
    from ..analyzer.analysis import analyze
    from ..analyzer.calibration import resolve_target
    from ..analyzer.hardware import stored
    from ..analyzer.sweep import sweep_rows

    try:
        # `analyze --batch B --dim ...`'s own path: the same figures for the same model
        result = analyze(source, batch=rid.batch, dims=dict(rid.dims) or None)
        figures = {k: result.totals[k] for k in STAT_FIELDS}
        dtypes = result.macs_by_dtype
        # A measured row's precision: that of the element type doing most of the MACs, in the
        # words of the estimates' precisions.
        top = max(dtypes, key=dtypes.__getitem__) if dtypes else "float32"
        # The dims a measurement pins: the spec's, and a KV cache's head dim the analysis
        # read from the model (`analyze`'s dims_added), without which ORT refuses the inputs.
        stats = {**figures, "precision": stored(top).peak,
                 "dims": {**rid.dims, **result.dims_added}}
    except Exception as e:  # a model that fails is an error row, never a failed sweep
        why = one_line(e)
        return None, why, [error_row(rid, p, hw, "estimate", why)
                           for p, hw in itertools.product(precisions, hardware)]
    try:
        targets = [resolve_target(hw, threads) for hw in hardware]
    except Exception as e:  # a profile or calibration that cannot be read: every estimate
        return stats, None, [error_row(rid, p, hw, "estimate", one_line(e), **figures)
                             for p, hw in itertools.product(precisions, hardware)]
    rows = []
    for precision in precisions:  # a precision that fails (a what-if of an int8 model) fails alone
        try:
            estimates = sweep_rows(lambda _b: result, [rid.batch], [precision], targets)
        except Exception as e:  # the model's figures stand; only these estimates failed
            rows += [error_row(rid, precision, hw, "estimate", one_line(e), **figures)
                     for hw in hardware]
            continue
        rows += [make_row(rid, precision, hw, "estimate", latency_s=r["latency_s"],
                          throughput_per_s=r["throughput_per_s"], energy_j=r["energy_j"],
                          **figures)
                 for hw, r in zip(hardware, estimates, strict=True)]
    return stats, None, rows


def measure_task(rid: RowId, source: Source, backend: str, stats: Mapping[str, Any],
                 threads: int, runs: int, warmup: int) -> dict[str, Any]:
    """One measured row: `warmup` untimed runs, then the median of `runs` timed runs of
    random inputs at the batch, and the peak memory of one run in a fresh process (None
    where it cannot be measured)."""
    precision = stats["precision"]
    try:
        latency, peak = _measure(rid, source, stats["dims"], backend, threads, runs, warmup)
    except Exception as e:
        return error_row(rid, precision, backend, "measured", one_line(e))
    return make_row(rid, precision, backend, "measured", latency_s=latency,
                    throughput_per_s=rid.batch / latency, peak_memory_bytes=peak,
                    **{k: stats[k] for k in STAT_FIELDS})


def _measure(rid: RowId, source: Source, dims: Mapping[str, int], name: str, threads: int,
             runs: int, warmup: int) -> tuple[float, int | None]:
    from ..analyzer.errors import UsageError
    from ..backends.base import fixed_batch, input_specs, load_proto, pin_dims, random_inputs
    from ..backends.memory import peak_memory
    from ..backends.registry import create

    specs = pin_dims(input_specs(load_proto(source, weights=False)), dims)
    fixed = fixed_batch(specs)
    if fixed is not None and fixed != rid.batch:
        raise UsageError(f"the model is fixed at batch {fixed}; batch {rid.batch} needs a model "
                         "name (exported at each batch) or a symbolic batch dim")
    backend = create(name, threads=threads)
    backend.prepare(source)
    feeds = random_inputs(specs, count=1, batch=rid.batch)[0]
    latency = backend.time(feeds, warmup=warmup, runs=runs).median_s
    with tempfile.TemporaryDirectory(prefix="onnxlens-sweep-") as tmp:
        path = source if isinstance(source, Path) else Path(tmp) / "model.onnx"
        if not isinstance(source, Path):
            path.write_bytes(source)  # peak memory runs in a fresh process, from a file
        peak, _why = peak_memory(name, threads, path, feeds)  # None: not measured
    return latency, peak
