"""The long fuzz run: worker processes feed random inputs to the targets of
`tests/fuzz/fuzz_targets.py` for a fixed time, and every crash, hang (over 20 s on one input)
or memory blow-up is saved with the input that caused it.

    python benchmarks/fuzz.py --seconds 600            # 10 minutes, one worker per core
    python benchmarks/fuzz.py --replay FINDING.bin     # run one saved input again
    python benchmarks/fuzz.py --atheris validation     # coverage-guided (pip install atheris)
    python benchmarks/fuzz.py --targets native         # the native executor's plans only

Each worker feeds every target in turn: it drives hypothesis's `fuzz_one_input` with random
bytes (the strategies turn them into models), re-arms a watchdog (`faulthandler`, which ends
a process stuck in C++ too) before each input, and runs under an address-space limit, so that
a runaway allocation is a MemoryError, not a dead machine. The parent restarts a worker that
died and charges the input it was on. Findings go to --out (default: a new temporary folder),
one .bin (the input) and one .txt (what happened) each; the summary prints executions and
findings per target, and the exit status is 1 if there is any.

The complexity oracle looks for inputs whose cost is large for their size, not only for hangs:
each input's seconds and peak-memory growth are divided by its bytes (the serialized model, for
the targets that draw one). An input is a finding when it takes at least `--slow-seconds` and
more than `--seconds-per-kb` per KiB (analysis should be about linear in the file: the bound is
10 s for any model under 1 MB), or grows the peak memory by at least 256 MiB and more than
`--memory-per-byte` bytes per byte of input. The worst offenders by time per byte are listed
at the end, findings or not, and their inputs kept in offenders/ for `--replay`.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
TARGETS = ("loader", "validation", "analyzer", "inputs", "native")
MEMORY_LIMIT = 8 << 30  # address space of a worker
# Complexity oracle defaults (see the module's docstring). A fuzzed model of a few hundred bytes
# is analyzed in 20-60 ms here (0.1 s per KiB): 1 s per KiB would be 17 minutes for 1 MB.
SLOW_SECONDS = 2.0
SECONDS_PER_KB = 1.0
MEMORY_MIN_GROWTH = 256 << 20
MEMORY_PER_BYTE = 4096
WORST_KEPT = 8  # offenders listed per worker and in the summary
# One thread per worker: workers x library thread pools would oversubscribe the cores.
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                     "MKL_NUM_THREADS")}


def _fuzzers() -> dict[str, Any]:
    """Target name -> a hypothesis test whose `.hypothesis.fuzz_one_input` takes raw bytes."""
    import fuzz_targets as t
    from hypothesis import HealthCheck, given, settings

    quiet = settings(database=None, deadline=None, suppress_health_check=list(HealthCheck))
    scratch = Path(tempfile.mkdtemp(prefix="onnxlens-fuzz-inputs-"))

    @quiet
    @given(t.mutated_model_bytes())
    def loader(data: bytes) -> None:
        t.loader(data)

    @quiet
    @given(t.op_graphs(max_nodes=1))
    def validation(model: Any) -> None:
        t.validation(model)

    @quiet
    @given(t.op_graphs(max_nodes=6, hostile=5))
    def analyzer(model: Any) -> None:
        t.analyzer(model)

    @quiet
    @given(t.mutated_input_files())
    def inputs(file: tuple[str, bytes]) -> None:
        t.inputs(*file, scratch)

    @quiet
    @given(t.mutated_plans())
    def native(plan: tuple[Any, ...]) -> None:
        t.native_plan(*plan)

    return {"loader": loader, "validation": validation, "analyzer": analyzer, "inputs": inputs,
            "native": native}


def _default_targets() -> list[str]:
    """Every target; `native` only where the extension is built."""
    import importlib.util

    built = importlib.util.find_spec("onnxlens.backends._native") is not None
    return [t for t in TARGETS if t != "native" or built]


# ---- one worker -------------------------------------------------------------------------------


COUNTS = ("executions", "results", "errors", "findings")


class TooCostly(AssertionError):
    """The complexity oracle's finding: an input too costly for its size."""


@dataclass(frozen=True)
class Oracle:
    """The complexity thresholds: an input is too costly for its size past either."""

    slow_seconds: float = SLOW_SECONDS
    seconds_per_kb: float = SECONDS_PER_KB
    memory_per_byte: float = MEMORY_PER_BYTE

    def verdict(self, size: int, seconds: float, grown: int) -> str | None:
        """Why this input is a finding, or None."""
        per_kb = seconds_per_kb(size, seconds)
        if seconds >= self.slow_seconds and per_kb > self.seconds_per_kb:
            return (f"took {seconds:.2f} s for {size:,} bytes ({per_kb:.2f} s per KiB, "
                    f"over {self.seconds_per_kb} s per KiB)")
        if grown >= MEMORY_MIN_GROWTH and grown / max(size, 1) > self.memory_per_byte:
            return (f"peak memory grew {grown / 2**20:.0f} MiB for {size:,} bytes "
                    f"({grown / max(size, 1):,.0f} bytes per byte, over "
                    f"{self.memory_per_byte:,.0f})")
        return None


def seconds_per_kb(size: int, seconds: float) -> float:
    """Seconds per KiB of input, an input under 1 KiB counted as 1 KiB (its fixed costs, a
    process's first import, would otherwise rank an empty input first)."""
    return seconds / (max(size, 1024) / 1024)


def _offender(target: str, data: bytes, seconds: float, grown: int) -> dict[str, Any]:
    return {"target": target, "bytes": len(data), "seconds": seconds, "grown": grown,
            "seconds_per_kb": seconds_per_kb(len(data), seconds),
            "input": hashlib.sha256(data).hexdigest()[:12]}


def _keep_worst(worst: list[dict[str, Any]], row: dict[str, Any], data: bytes, out: Path
                ) -> None:
    """Keep the `WORST_KEPT` inputs of largest seconds per KiB (their bytes in offenders/)."""
    if ((len(worst) >= WORST_KEPT and row["seconds_per_kb"] <= worst[-1]["seconds_per_kb"])
            or any(r["input"] == row["input"] for r in worst)):
        return
    folder = out / "offenders"
    folder.mkdir(exist_ok=True)
    (folder / f"{row['target']}-{row['input']}.bin").write_bytes(
        row["target"].encode() + b"\n" + data)
    worst.append(row)
    worst.sort(key=lambda r: r["seconds_per_kb"], reverse=True)
    del worst[WORST_KEPT:]


def worker(targets: list[str], seconds: float, seed: int, out: Path, ident: int,
           oracle: Oracle = Oracle()) -> None:
    """Feed the targets in turn, one input each, until the time is up; counts per target and
    the worst offenders go to status-ID.json every second, the input being run to
    current-ID.bin."""
    import fuzz_targets as t

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    current = out / f"current-{ident}.bin"

    def record(name: str, data: bytes) -> None:
        current.write_bytes(name.encode() + b"\n" + data)

    t.on_input = record
    fuzzers = _fuzzers()
    rng = random.Random(seed)
    stats = {name: dict.fromkeys(COUNTS, 0) for name in targets}
    status = out / f"status-{ident}.json"
    deadline = time.monotonic() + seconds
    last_status = 0.0
    outcome: list[bool] = []
    worst: list[dict[str, Any]] = []
    run_target = t.run_target

    def counted(name: str, data: bytes, call: Any) -> bool:
        peak, start = t._peak_rss(), time.perf_counter()
        ok = run_target(name, data, call)
        spent, grown = time.perf_counter() - start, t._peak_rss() - peak
        outcome.append(ok)
        _keep_worst(worst, _offender(name, data, spent, grown), data, out)
        why = oracle.verdict(len(data), spent, grown)
        if why is not None:
            raise TooCostly(f"{name}: {why}")
        return ok

    t.run_target = counted
    turn = 0
    while time.monotonic() < deadline:
        target = targets[turn % len(targets)]
        turn += 1
        outcome.clear()
        faulthandler.dump_traceback_later(t.HANG_SECONDS + 5, exit=True)
        try:
            fuzzers[target].hypothesis.fuzz_one_input(rng.randbytes(rng.randint(16, 4096)))
        except Exception as e:  # the finding: any exception that is not an OnnxLensError
            stats[target]["findings"] += 1
            _save_finding(out, current.read_bytes(), traceback.format_exc(), type(e).__name__)
        finally:
            faulthandler.cancel_dump_traceback_later()
        if outcome:
            stats[target]["executions"] += 1
            stats[target]["results" if outcome[-1] else "errors"] += 1
        if time.monotonic() - last_status > 1.0:
            status.write_text(json.dumps({"targets": stats, "worst": worst}))
            last_status = time.monotonic()
    status.write_text(json.dumps({"targets": stats, "worst": worst}))


def _save_finding(out: Path, recorded: bytes, what: str, kind: str) -> Path:
    """`recorded`: target name, newline, input bytes. Same input, same file."""
    name, _, data = recorded.partition(b"\n")
    digest = hashlib.sha256(data).hexdigest()[:12]
    path = out / "findings" / f"{name.decode()}-{kind}-{digest}.bin"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(recorded)
    path.with_suffix(".txt").write_text(what)
    return path


# ---- the parent -------------------------------------------------------------------------------


def run(seconds: float, workers: int, targets: list[str], out: Path, seed: int,
        oracle: Oracle = Oracle()) -> dict:
    """Keep `workers` workers busy for `seconds`; a worker that dies is charged a finding for
    the input it was on, and replaced."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + seconds
    slots: dict[int, subprocess.Popen[bytes]] = {}
    totals = {name: dict.fromkeys(COUNTS, 0) for name in targets}
    worst: list[dict[str, Any]] = []
    restarts = 0

    def start(ident: int) -> None:
        left = max(deadline - time.monotonic(), 1.0)
        slots[ident] = subprocess.Popen(
            [sys.executable, __file__, "--worker", ",".join(targets), "--seconds", f"{left:.1f}",
             "--seed", str(seed * 1000 + ident * 7 + restarts), "--out", str(out),
             "--id", str(ident), *(f"--{k.replace('_', '-')}={v}" for k, v in
                                   asdict(oracle).items())],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **ONE_THREAD})

    def harvest(ident: int) -> None:
        status = out / f"status-{ident}.json"
        if status.exists():
            found = json.loads(status.read_text())
            for name, stats in found["targets"].items():
                for key in COUNTS:
                    totals[name][key] += stats[key]
            worst.extend(found["worst"])
            status.unlink()

    for ident in range(workers):
        start(ident)
    while slots:
        time.sleep(0.5)
        for ident, proc in list(slots.items()):
            code = proc.poll()
            if code is None:
                continue
            harvest(ident)
            del slots[ident]
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            current = out / f"current-{ident}.bin"
            if code != 0 and current.exists():  # a hang (the watchdog exits), a crash, a kill
                recorded = current.read_bytes()
                kind = "hang" if "Timeout" in err else f"exit{code}"
                _save_finding(out, recorded, err[-20000:], kind)
                totals[recorded.partition(b"\n")[0].decode()]["findings"] += 1
            if code != 0 and time.monotonic() < deadline - 2:
                restarts += 1
                start(ident)
    for current in out.glob("current-*.bin"):
        current.unlink()
    worst.sort(key=lambda r: r["seconds_per_kb"], reverse=True)
    return {"seconds": seconds, "workers": workers, "restarts": restarts, "targets": totals,
            "oracle": asdict(oracle), "worst": worst[:WORST_KEPT],
            "findings": sorted(str(p) for p in (out / "findings").glob("*.bin"))
            if (out / "findings").exists() else []}


def print_worst(worst: list[dict[str, Any]], folder: Path) -> None:
    """The inputs of largest time per byte, findings or not (inputs in `folder`)."""
    print(f"worst time per byte (inputs in {folder}):")
    print(f"{'target':<12}{'bytes':>8}{'seconds':>9}{'s/KiB':>8}{'peak +MiB':>10}  input")
    for r in worst:
        print(f"{r['target']:<12}{r['bytes']:>8,}{r['seconds']:>9.3f}{r['seconds_per_kb']:>8.3f}"
              f"{r['grown'] / 2**20:>10.0f}  {r['target']}-{r['input']}.bin")


def replay(path: Path) -> None:
    """Run one saved input again, in this process, and show what happens."""
    import fuzz_targets as t
    import onnx

    name, _, data = path.read_bytes().partition(b"\n")
    target = name.decode()
    if target == "loader":
        ok = t.loader(data)
    elif target in ("validation", "analyzer"):
        ok = getattr(t, target)(onnx.load_from_string(data))
    elif target == "native":
        ok = t.native_plan(*t.plan_from_bytes(data))
    else:
        suffix, _, content = data.partition(b"\0")
        ok = t.inputs(suffix.decode(), content, Path(tempfile.mkdtemp()))
    print(f"{target}: {'a result' if ok else 'an OnnxLensError'} (no finding)")


def atheris_main(target: str, argv: list[str]) -> None:
    """Coverage-guided fuzzing of one target with atheris (libFuzzer arguments after it)."""
    import atheris

    with atheris.instrument_imports(include=["onnxlens", "fuzz_targets"]):
        fuzzers = _fuzzers()
    # Full-length inputs from the start: short ones draw no model, so they find no coverage.
    defaults = [f for f in ("-len_control=0", "-max_len=4096")
                if not any(a.startswith(f.split("=")[0] + "=") for a in argv)]
    atheris.Setup([sys.argv[0], *defaults, *argv], fuzzers[target].hypothesis.fuzz_one_input)
    atheris.Fuzz()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--targets", default=",".join(_default_targets()))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--replay", type=Path)
    parser.add_argument("--atheris", choices=TARGETS)
    parser.add_argument("--slow-seconds", type=float, default=SLOW_SECONDS,
                        help="complexity oracle: inputs at least this slow are judged per KiB")
    parser.add_argument("--seconds-per-kb", type=float, default=SECONDS_PER_KB,
                        help="complexity oracle: a finding past this many seconds per KiB")
    parser.add_argument("--memory-per-byte", type=float, default=MEMORY_PER_BYTE,
                        help="complexity oracle: a finding past this peak-memory growth per "
                        "byte of input (and 256 MiB)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--id", type=int, default=0, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    oracle = Oracle(args.slow_seconds, args.seconds_per_kb, args.memory_per_byte)
    if args.replay:
        replay(args.replay)
    elif args.atheris:
        atheris_main(args.atheris, rest)
    elif args.worker:
        worker(args.worker.split(","), args.seconds, args.seed, args.out, args.id, oracle)
    else:
        targets = [t for t in args.targets.split(",") if t]
        unknown = sorted(set(targets) - set(TARGETS))
        if unknown:
            parser.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
        out = args.out or Path(tempfile.mkdtemp(prefix="onnxlens-fuzz-"))
        summary = run(args.seconds, args.workers, targets, out, args.seed, oracle)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(f"fuzzed {summary['seconds']:.0f} s with {summary['workers']} workers "
              f"({summary['restarts']} restarts); findings in {out / 'findings'}")
        print(f"{'target':<12}{'executions':>12}{'results':>10}{'errors':>10}{'findings':>10}")
        for name, s in sorted(summary["targets"].items()):
            print(f"{name:<12}{s['executions']:>12,}{s['results']:>10,}{s['errors']:>10,}"
                  f"{s['findings']:>10}")
        print_worst(summary["worst"], out / "offenders")
        if summary["findings"]:
            sys.exit(1)


if __name__ == "__main__":
    main()
