"""Peak memory of a backend running a model, measured in a fresh process.

What is measured: in a new Python process that has already imported the backend's libraries,
the peak resident set size while the backend loads the model and runs it twice, minus the
resident size just before loading. That is the memory the model costs this backend: weights
(and any copies the backend makes of them while optimizing), arenas and activations.

Why a fresh process: resident memory only shows what a process holds, and a long-lived one
reuses pages it freed earlier (an earlier backend's, the analysis'), which hides the new
model's needs. On Linux the peak is reset to the current size just before loading
(``/proc/self/clear_refs``) and read from ``VmHWM``; elsewhere `ru_maxrss` is the peak. ORT does
not expose its arena statistics, and torch has no CPU allocator statistics, so process
memory is the one figure measured the same way for every backend. Pages the backend maps but
never touches are not counted (they cost nothing).

The child gets the backend name, thread count, model path, inputs and, for torch, the module
factory through a pickle file; a factory that cannot be pickled (a lambda) means no figure,
with the reason. The child runs in the job's temporary folder: ``python -m`` puts the current
folder first on ``sys.path``, so a user's file named like a standard module (``grp.py``) would
shadow it there. The parent's ``sys.path`` goes after the child's own, so a factory defined in
the user's folder still unpickles.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .torch_eager import ModuleFactory

TIMEOUT_S = 600
_STATUS = Path("/proc/self/status")


def peak_memory(name: str, threads: int, model: Path, inputs: Mapping[str, np.ndarray],
                factory: ModuleFactory | None = None) -> tuple[int | None, str]:
    """(peak bytes, "") or (None, why not)."""
    payload = {"name": name, "threads": threads, "model": str(Path(model).resolve()),
               "inputs": dict(inputs), "factory": factory}
    # '' on sys.path means the current folder, which the child does not share
    search_path = [str(Path(entry or ".").resolve()) for entry in sys.path]
    with tempfile.TemporaryDirectory(prefix="onnxlens-mem-") as tmp:
        job = Path(tmp) / "job.pickle"
        try:
            job.write_bytes(pickle.dumps({"sys_path": search_path,
                                          "payload": pickle.dumps(payload)}))
        except (pickle.PicklingError, AttributeError, TypeError):
            return None, ("peak memory not measured: the module factory cannot be pickled for "
                          "the measuring process (give a module-level function or a "
                          "functools.partial of one)")
        try:
            done = subprocess.run([sys.executable, "-m", __name__, str(job)], cwd=tmp,
                                  capture_output=True, text=True, errors="replace",
                                  timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return None, f"peak memory not measured: the probe ran over {TIMEOUT_S} s"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return None, f"peak memory not measured: {lines[-1] if lines else 'the probe failed'}"
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak_memory_bytes"]), ""


def _resident() -> dict[str, int]:
    """VmRSS and VmHWM in bytes (Linux)."""
    fields = {}
    for line in _STATUS.read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _max_rss() -> int:
    """ru_maxrss in bytes (kilobytes on Linux, bytes on macOS)."""
    import resource  # Unix only

    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value if sys.platform == "darwin" else value * 1024


def _child(job: Path) -> int:
    from .registry import create

    job_file = pickle.loads(job.read_bytes())
    sys.path.extend(entry for entry in job_file["sys_path"] if entry not in sys.path)
    payload = pickle.loads(job_file["payload"])
    backend = create(payload["name"], threads=payload["threads"],
                     torch_factory=payload["factory"])
    if payload["factory"] is not None:
        import torch  # noqa: F401  (libraries are loaded before the baseline)
    procfs = _STATUS.exists() and _reset_peak()
    before = _resident()["VmRSS"] if procfs else _max_rss()
    backend.prepare(payload["model"])
    for _ in range(2):
        backend.run(payload["inputs"])
    peak = _resident()["VmHWM"] if procfs else _max_rss()
    return max(0, peak - before)


if __name__ == "__main__":
    print(json.dumps({"peak_memory_bytes": _child(Path(sys.argv[1]))}))
