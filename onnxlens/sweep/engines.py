"""The two engines that run a sweep's tasks (`driver.Sweep`).

- local: a process pool. The analyses run in parallel, one worker per CPU; the measurements
  then run one at a time, so that no two timings share the cores.
- ray: Ray tasks. Model bytes go through the object store (`ray.put`, once per file), so
  workers need no shared filesystem; on the local instance a sweep starts for itself, whose
  only node is this machine, tasks get the paths instead (no copy of every model through the
  store: 0.4 s of a 180-row sweep over 0.7 GB of models). A measurement asks for one
  `onnxlens_timing_slot` (each node has one: no two timings overlap on a node) and for the
  resource its backend is pinned to (`[resources]` in the spec). A task whose worker or node
  is lost is retried (`max_retries`); once out of retries, or when no node left has the
  resource it needs, its rows are errors that say so. The local instance starts without the
  head processes a sweep never uses and returns as soon as its raylet registers
  (`_lean_start`): Ray's start-up is most of what a short sweep on Ray costs beyond the pool.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from .driver import Sweep, Work
from .tasks import analyze_task, measure_task, one_line

TIMING_SLOT = "onnxlens_timing_slot"
RETRIES = 3  # attempts after the first when a worker or node dies under a task
POLL_S = 0.5  # how often a pending measurement checks that its resources still exist


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def run_local(sweep: Sweep) -> None:
    import multiprocessing

    spec = sweep.spec
    # spawn: the driver has threads (the progress bar) that a forked child would inherit
    # mid-lock; each worker imports onnxlens once and serves many tasks.
    with ProcessPoolExecutor(min(_cpus(), len(sweep.works)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        futures: dict[Future, Work] = {
            pool.submit(analyze_task, w.rid, w.model.path, spec.precision, spec.hardware,
                        spec.threads): w for w in sweep.works}
        for future in as_completed(futures):
            work = futures[future]
            try:
                sweep.analyzed(work, future.result())
            except Exception as e:  # the worker process died (a crash in native code)
                sweep.lost(work, f"worker lost: {one_line(e)}")
        for work, backend in sweep.measurements():
            try:
                row = pool.submit(measure_task, work.rid, sweep.measure_source(work), backend,
                                  work.stats, spec.threads, spec.runs, spec.warmup).result()
            except Exception as e:
                sweep.lost(work, f"worker lost: {one_line(e)}", backend=backend)
                continue
            sweep.emit(row)


@contextmanager
def ray_connected(address: str | None) -> Iterator[bool]:
    """Ray joined (or started) for the block, and left after it (`_connect`). Yields whether
    the instance is one this call started here (its only node is this machine)."""
    import ray

    joined = _connect(ray, address)
    try:
        yield joined == "started"
    finally:
        if joined is not None:
            ray.shutdown()  # stops the instance too when this process started it


def _connect(ray: Any, address: str | None) -> str | None:
    """Join `address`, else RAY_ADDRESS, else an instance already joined (None: left as it
    is), else start one here with one timing slot (`_lean_start`): "joined" or "started"."""
    if ray.is_initialized():
        return None
    quiet = {"log_to_driver": False, "configure_logging": False}
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or os.environ["RAY_ADDRESS"], **quiet)
        return "joined"
    with _lean_start(ray):
        # "local": a new instance, even where `ray start` (or a ray.cluster_utils.Cluster)
        # has left its address for ray.init() to join (which then refused num_cpus)
        ray.init(address="local", num_cpus=_cpus(), resources={TIMING_SLOT: 1},
                 include_dashboard=False, **quiet)
    return "started"


# What `ray.init` starts for a new instance (Ray 2.60, ray/_private/node.py) that the sweep's
# own single-node instance never uses: the API server (with include_dashboard=False it serves
# usage stats alone, which ray.init turns off for a released Ray, and ray.init waits until it
# is up: 0.6-1.2 s), the autoscaler monitor (one node never scales; ray.shutdown, which stops
# the GCS first, waited a second for it to give up reporting) and the log monitor (it streams
# worker logs to drivers: log_to_driver=False). On two cores, each of them also takes CPU from
# the raylet's agents, which ray.init waits for. A Ray without these methods starts them all.
UNUSED_HEAD_PROCESSES = ("start_api_server", "start_monitor", "start_log_monitor")
REGISTERED_POLL_S = 0.02
RAYLET_START_WAIT_S = 30  # Ray's own limit (raylet_start_wait_time_s) for the registration


@contextmanager
def _lean_start(ray: Any) -> Iterator[None]:
    """`ray.init` starting a local instance without UNUSED_HEAD_PROCESSES, and returning as
    soon as its raylet has registered (`_registered_first`)."""
    node_class = getattr(getattr(ray._private, "node", None), "Node", None)
    services = getattr(ray._private, "services", None)
    with ExitStack() as patches:
        for name in UNUSED_HEAD_PROCESSES:
            if hasattr(node_class, name):
                patches.enter_context(mock.patch.object(node_class, name, _not_started))
        if hasattr(services, "get_node"):
            patches.enter_context(mock.patch.object(
                services, "get_node", _registered_first(ray, services.get_node)))
        yield


def _not_started(*_args: Any, **_kwargs: Any) -> None:
    return None


def _registered_first(ray: Any, get_node: Callable[[str, str], Any]
                      ) -> Callable[[str, str], Any]:
    """Ray's `get_node`, called once the node has registered with the GCS. Ray's own (C++
    GlobalStateAccessor::GetNode) sleeps a whole second after each miss, and the raylet, which
    waits for its agents, registers 1-2 s after it starts: up to 0.9 s lost. This asks every
    20 ms; past Ray's limit, `get_node` gives Ray's own error."""
    def get_registered_node(gcs_address: str, node_id: str) -> Any:
        client = ray._raylet.GcsClient(address=gcs_address)
        node = ray.NodeID.from_hex(node_id)
        deadline = time.monotonic() + RAYLET_START_WAIT_S
        while node not in client.get_all_node_info(timeout=5) and time.monotonic() < deadline:
            time.sleep(REGISTERED_POLL_S)
        return get_node(gcs_address, node_id)

    return get_registered_node


def run_ray(sweep: Sweep, *, local: bool) -> None:
    """The sweep's tasks on the Ray instance joined (`ray_connected`); `local`: an instance
    on this machine alone, whose tasks read the models where they are."""
    import ray

    spec = sweep.spec
    blobs: dict[Path, Any] = {}

    def blob(path: Path) -> Any:
        if path not in blobs:
            blobs[path] = path if local else ray.put(path.read_bytes())
        return blobs[path]

    analyze = ray.remote(analyze_task).options(num_cpus=1, max_retries=RETRIES)
    measure = ray.remote(_measure_on_node)
    pending = {analyze.remote(w.rid, blob(w.model.path), spec.precision, spec.hardware,
                              spec.threads): (w, None, {}) for w in sweep.works}
    _drain(ray, pending, lambda w, _b, result: sweep.analyzed(w, result), sweep.lost)
    pending = {}
    for work, backend in sweep.measurements():
        resources = {TIMING_SLOT: 1, **({spec.resources[backend]: 1}
                                        if backend in spec.resources else {})}
        missing = _missing(ray, resources)
        if missing:
            sweep.lost(work, _no_node(missing), backend=backend)
            continue
        ref = measure.options(num_cpus=spec.threads, resources=resources,
                              max_retries=RETRIES).remote(
            work.rid, blob(sweep.measure_source(work)), backend, work.stats, spec.threads,
            spec.runs, spec.warmup)
        pending[ref] = (work, backend, resources)
    _drain(ray, pending, lambda _w, _b, row: sweep.emit(row), sweep.lost)


def _measure_on_node(*args: Any) -> dict[str, Any]:
    """`measure_task`, its row's host naming the Ray node that ran it (pinning shows)."""
    import ray

    row = measure_task(*args)
    row["host"]["node"] = ray.get_runtime_context().get_node_id()
    return row


def _drain(ray: Any, pending: dict[Any, tuple[Work, str | None, dict[str, float]]],
           done: Callable[[Work, str | None, Any], None],
           lost: Callable[..., None]) -> None:
    """Wait for every task; a task Ray gave up on, or one no node can run any more (its
    pinned node left the cluster), becomes error rows."""
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
        for ref in ready:
            work, backend, _ = pending.pop(ref)
            try:
                done(work, backend, ray.get(ref))
            except ray.exceptions.RayError as e:
                lost(work, f"lost after {RETRIES} retries: {one_line(e)}", backend=backend)
        if ready:
            continue
        for ref, (work, backend, resources) in list(pending.items()):
            missing = _missing(ray, resources)
            if missing:
                ray.cancel(ref, force=True)
                del pending[ref]
                lost(work, _no_node(missing), backend=backend)


def _missing(ray: Any, resources: dict[str, float]) -> list[str]:
    available = ray.cluster_resources()
    return [r for r in resources if available.get(r, 0) < 1]


def _no_node(missing: list[str]) -> str:
    return (f"no node of the Ray cluster has the resource {', '.join(missing)} (start a node "
            f"with ray start --resources '{{\"{missing[0]}\": 1}}')")
