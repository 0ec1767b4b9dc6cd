"""The sweep driver: resolve the models, list the rows not yet done, hand the work to an engine,
write each row as it comes back, then results.csv and report.html.

Work comes in two phases, under either engine. First one `analyze_task` per (model, batch)
with rows to do, in parallel: it makes the estimate rows and the figures the measured rows
repeat. Then one `measure_task` per (model, batch, backend), which the engine keeps from
overlapping another timing on the same machine (and, as far as it can, from estimates: they
all ran in the first phase).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analyzer.errors import UsageError
from .results import RESULTS, RESULTS_CSV, ResultsLog, read_rows, write_csv
from .spec import SweepSpec
from .tasks import RowId, error_row, model_sha256, one_line, row_key

REPORT = "report.html"
ENGINES = ("local", "ray")
# (rows done, rows in all, rows failed): the progress bar's callback
Progress = Callable[[int, int, int], None]


@dataclass(frozen=True)
class ModelFile:
    """A spec model resolved to a file here, or why it could not be."""

    name: str
    path: Path | None
    sha256: str | None
    error: str | None
    exported: bool  # onnxlens exported it: a measurement at another batch re-exports it


@dataclass
class Work:
    """One (model, batch): its analysis task and the measurements that follow it."""

    rid: RowId
    model: ModelFile
    estimates: set[tuple[Any, ...]]  # keys of the estimate rows still to do
    measures: list[str]  # backends still to measure
    stats: dict[str, Any] | None = None
    error: str | None = None  # why the analysis failed


@dataclass
class Sweep:
    """What the engines fill in: each row goes to results.jsonl the moment it arrives."""

    spec: SweepSpec
    log: ResultsLog
    works: list[Work]
    total: int
    progress: Progress | None = None
    done: int = 0
    failed: int = 0
    skipped: int = 0
    _measure_sources: dict[tuple[str, int], Path] = field(default_factory=dict)

    def emit(self, row: dict[str, Any]) -> None:
        self.log.append(row)
        self.done += 1
        self.failed += row["status"] != "ok"
        if self.progress is not None:
            self.progress(self.done, self.total, self.failed)

    def analyzed(self, work: Work, outcome: tuple[dict[str, Any] | None, str | None,
                                                  list[dict[str, Any]]]) -> None:
        work.stats, work.error, rows = outcome
        for row in rows:
            if row_key(row) in work.estimates:
                self.emit(row)

    def lost(self, work: Work, why: str, *, backend: str | None = None) -> None:
        """Error rows for what a task that never came back was to make."""
        if backend is not None:
            self.emit(error_row(work.rid, _precision(work), backend, "measured", why))
            return
        work.error = why
        for key in sorted(work.estimates, key=str):
            self.emit(error_row(work.rid, key[2], key[3], "estimate", why))

    def measurements(self) -> list[tuple[Work, str]]:
        """The (work, backend) pairs to time, after the analyses; error rows for those whose
        model failed."""
        todo = []
        for work in self.works:
            for backend in work.measures:
                if work.stats is None:
                    self.emit(error_row(work.rid, _precision(work), backend, "measured",
                                        work.error or "the model's analysis failed"))
                else:
                    todo.append((work, backend))
        return todo

    def measure_source(self, work: Work) -> Path:
        """The file to time at the work's batch: a model onnxlens exports is exported at that
        batch (cached); a file is timed as it is."""
        model, batch = work.model, work.rid.batch
        if not model.exported or batch == self.spec.batch[0]:
            return model.path
        key = (model.name, batch)
        if key not in self._measure_sources:
            from ..exporters.torch_export import cached_export

            self._measure_sources[key] = cached_export(model.name, batch=batch)
        return self._measure_sources[key]


def _precision(work: Work) -> str:
    return (work.stats or {}).get("precision", "")


@dataclass(frozen=True)
class Outcome:
    rows: int  # rows this run produced
    failed: int
    skipped: int  # rows done by an earlier run
    out: Path

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def run_sweep(spec: SweepSpec, out: Path, *, engine: str = "local", address: str | None = None,
              progress: Progress | None = None) -> Outcome:
    """Run every row of `spec` not already in `out`/results.jsonl; write results.csv and
    report.html from all of its rows."""
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if address and engine != "ray":
        raise UsageError("--address goes with --engine ray")
    log = ResultsLog(out)
    try:
        sweep = _run(spec, log, engine, address, progress)
    finally:
        log.close()
    write_outputs(out, log.rows)
    return Outcome(sweep.done, sweep.failed, sweep.skipped, out)


def _run(spec: SweepSpec, log: ResultsLog, engine: str, address: str | None,
         progress: Progress | None) -> Sweep:
    """Plan the sweep, then run its works on `engine`. Ray's start-up (seconds: `ray.init`
    waits for its raylet, and wants the main thread) runs beside the planning (which hashes
    every model), unless every row is done already and Ray is not needed."""
    from .engines import ray_connected, run_local, run_ray

    if engine == "local" or len(log.done) >= spec.rows:
        sweep = _plan(spec, log, progress)
        if sweep.works and engine == "local":
            run_local(sweep)
        elif sweep.works:
            with ray_connected(address) as local:
                run_ray(sweep, local=local)
        return sweep
    with ThreadPoolExecutor(1, thread_name_prefix="sweep-plan") as pool:
        planning = pool.submit(_plan, spec, log, progress)
        with ray_connected(address) as local:
            sweep = planning.result()
            if sweep.works:
                run_ray(sweep, local=local)
    return sweep


def write_outputs(out: Path, rows: list[dict[str, Any]], report: Path | None = None) -> Path:
    from ..reports.sweep_html import write_sweep_html

    write_csv(rows, out / RESULTS_CSV)
    return write_sweep_html(rows, report or out / REPORT)


def rewrite_outputs(out: Path, report: Path | None = None) -> Path:
    """`onnxlens report DIR`: results.csv and the report again, from results.jsonl."""
    path = out / RESULTS
    if not path.is_file():
        raise UsageError(f"{out}: no {RESULTS} (not a sweep's --out directory)")
    return write_outputs(out, read_rows(path), report)


def _plan(spec: SweepSpec, log: ResultsLog, progress: Progress | None) -> Sweep:
    """The works with rows still to do; the rows of unreadable models are errors at once."""
    sweep = Sweep(spec, log, [], 0, progress)
    unreadable: list[dict[str, Any]] = []
    for name in spec.models:
        model = _resolve(name, spec.batch[0])
        for batch in spec.batch:
            rid = RowId(name, model.sha256, batch, spec.dims.get(name, {}))
            estimates = {(model.sha256, batch, p, hw, "estimate") for p, hw in
                         itertools.product(spec.precision, spec.hardware)} - log.done
            measures = [b for b in spec.measure
                        if (model.sha256, batch, "", b, "measured") not in log.done]
            sweep.skipped += spec.rows_per_batch - len(estimates) - len(measures)
            if model.error is not None:
                unreadable += [error_row(rid, k[2], k[3], "estimate", model.error)
                               for k in sorted(estimates, key=str)]
                unreadable += [error_row(rid, "", b, "measured", model.error) for b in measures]
            elif estimates or measures:
                sweep.works.append(Work(rid, model, estimates, measures))
    sweep.total = len(unreadable) + sum(len(w.estimates) + len(w.measures) for w in sweep.works)
    if progress is not None:
        progress(0, sweep.total, 0)
    for row in unreadable:
        sweep.emit(row)
    return sweep


def _resolve(name: str, batch: int) -> ModelFile:
    """The spec's model as a file here (exported once and cached when it is a name), hashed."""
    from ..api import resolve_model

    try:
        path = resolve_model(name, batch=batch, image_size=None, keep_batchnorm=False,
                             opset=None)
        return ModelFile(name, path, model_sha256(path), None,
                         exported=path != Path(name))
    except Exception as e:  # an unreadable model is error rows, never a failed sweep
        return ModelFile(name, None, None, one_line(e), exported=False)
