"""`onnxlens sweep --engine ray` with no cluster to join: the sweep starts a local Ray instance
without the head processes it never uses (API server, autoscaler monitor, log monitor), its
tasks read the models by path (the instance's only node is this machine), and it stops the
instance, every process it started included, when done. Apart from test_sweep.py, whose
module-wide cluster would be joined instead."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_sweep import _order, _rows, _spec, models  # noqa: F401 (a fixture)

from onnxlens.sweep import parse_spec, run_sweep


def _live_children() -> set[int]:
    """This process's children that have not exited (Ray's head processes are started by the
    driver: its GCS, raylet, autoscaler monitor, dashboard and log monitor)."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited while listed
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            children.add(int(stat.parent.name))
    return children


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_local_ray_instance_started_used_and_stopped(models: dict[str, Path],  # noqa: F811
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized(), "a Ray instance is joined already: nothing would start"
    # the address `ray start` (or a live ray.cluster_utils.Cluster) leaves for ray.init() to
    # join: the sweep starts its own instance all the same
    monkeypatch.setattr(ray._private.utils, "read_ray_address", lambda *_: "127.0.0.1:9")
    base = _spec(models["small"], models["big"])
    run_sweep(parse_spec(base), tmp_path / "local")
    before = _live_children()  # the process pool's resource tracker stays
    spec = parse_spec(base | {"measure": ["ort-cpu"], "runs": 3, "warmup": 1})
    started: set[str] = set()  # the kinds of process Ray's node started, seen mid-sweep

    def progress(*_counts: int) -> None:
        node = getattr(ray._private.worker, "_global_node", None)
        started.update(node.all_processes if node is not None else ())

    outcome = run_sweep(spec, tmp_path / "ray", engine="ray", progress=progress)

    assert outcome.failed == 0
    rows = _rows(tmp_path / "ray")
    estimates = [r for r in rows if r["kind"] == "estimate"]
    assert sorted(estimates, key=_order) == sorted(_rows(tmp_path / "local"), key=_order)
    assert len([r for r in rows if r["kind"] == "measured"]) == 4  # 2 models x 2 batches
    assert {"gcs_server", "raylet"} <= started
    assert not started & {"dashboard", "monitor", "log_monitor"}
    assert not ray.is_initialized()
    assert _live_children() <= before
