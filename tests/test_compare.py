"""`compare`: ORT CPU against torch on ResNet-18, per-group measured versus estimated, the JSON
contract, batch sweeps, unavailable backends, and the terminal view."""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

from onnxlens.analyzer.analysis import analyze
from onnxlens.analyzer.errors import ModelLoadError, UsageError
from onnxlens.backends.compare import Comparison, ModelSpec, attach_measurements, compare
from onnxlens.backends.memory import peak_memory
from onnxlens.backends.registry import TORCH_NEEDS_MODULE, list_backends
from onnxlens.reports.compare_terminal import render_backends, render_comparison

FAST = {"runs": 3, "warmup": 1, "profile_runs": 2}


@pytest.fixture(scope="module")
def resnet18_module_and_path(export_dir: Path):
    import torch
    import torchvision

    from onnxlens.exporters.torch_export import export_module

    torch.manual_seed(0)
    module = torchvision.models.resnet18(weights=None).eval()
    path = export_module(module, (torch.randn(1, 3, 224, 224),), export_dir / "r18_cmp.onnx")
    return module, path


@pytest.fixture(scope="module")
def comparison(resnet18_module_and_path) -> tuple[Comparison, list[tuple[int, int, str]]]:
    module, path = resnet18_module_and_path
    steps: list[tuple[int, int, str]] = []
    result = compare(ModelSpec(path, torch_factory=lambda: module),
                     ["ort-cpu", "ort-cuda", "torch"], threads=1, samples=20, memory=True,
                     hardware={"ort-cpu": "epyc_9654"},
                     progress=lambda done, total, what: steps.append((done, total, what)),
                     **FAST)
    return result, steps


def test_ort_cpu_and_torch_agree_on_resnet18(comparison) -> None:
    result, _ = comparison
    (pair,) = result.agreements
    assert (pair.reference, pair.candidate, pair.samples) == ("ort-cpu", "torch", 20)
    (out,) = pair.outputs
    assert out.top1 == 1.0
    assert out.min_cosine > 0.9999
    assert pair.passed


def test_per_group_times_add_up_to_the_model_time(comparison) -> None:
    result, _ = comparison
    run = result.runs["ort-cpu"]
    assert run.times is not None
    assert sum(run.times.group_s.values()) == pytest.approx(run.latency_s, rel=0.10)
    assert run.times.unmapped_share < 0.05
    assert result.runs["torch"].times is None  # no per-kernel profile: ORT's groups only


def test_cuda_is_skipped_with_one_line(comparison) -> None:
    result, _ = comparison
    if "ort-cuda" in result.runs:
        pytest.skip("a CUDA device is usable here")
    reason = result.unavailable["ort-cuda"]
    assert reason.startswith("CUDA EP unavailable: ") and "\n" not in reason
    assert not result.nothing_ran


def test_json_contract(comparison) -> None:
    result, _ = comparison
    d = json.loads(json.dumps(result.to_dict()))  # plain JSON types only
    assert d["schema"] == "onnxlens-compare/1"
    m = d["measurements"]["ort-cpu"]
    assert set(m["latency_s"]) >= {"median", "p90", "min", "spread"}
    assert m["throughput_per_s"] == pytest.approx(1 / m["latency_s"]["median"])
    assert m["threads"] == 1 and m["peak_memory_bytes"] > 10 * 2**20  # weights are 46 MB
    assert 0 <= m["unmapped_share"] < 0.05
    assert m["profile"]["mapped_kernels"] == m["profile"]["kernels"] - 1  # ReorderOutput
    assert d["measurements"]["torch"]["peak_memory_bytes"] is None  # a lambda factory
    assert any("pickled" in n for n in d["measurements"]["torch"]["notes"])
    assert set(d["agreement"]) == {"ort-cpu vs torch"}
    assert len(d["groups"]) == len(result.analysis.groups)
    assert all("ort-cpu" in g["measured"] for g in d["groups"])


def test_estimate_beside_the_measurement(comparison) -> None:
    result, _ = comparison
    d = result.to_dict()
    est = d["measurements"]["ort-cpu"]["estimate"]
    assert est["hardware"] == "epyc_9654"
    assert est["error_ratio"] == pytest.approx(est["latency_s"] / result.runs["ort-cpu"].latency_s)
    ratios = {g["id"]: g["estimated"]["ort-cpu"]["error_ratio"] for g in d["groups"]}
    off = [abs(math.log(ratios[g])) for g in est["furthest_off_groups"]]
    assert off == sorted(off, reverse=True) and len(off) == 10
    torch_estimate = d["measurements"]["torch"]["estimate"]  # `host` by default, if it loads
    assert torch_estimate is None or torch_estimate["hardware"] == "host"


def test_attach_measurements_to_the_analysis_json(comparison) -> None:
    result, _ = comparison
    analysis = result.analysis.to_dict()
    merged = attach_measurements(analysis, result.to_dict())
    assert "measurements" not in analysis  # the input is not changed
    assert set(merged["measurements"]) == {"ort-cpu", "torch"}
    group = merged["groups"][0]
    assert group["measured"]["ort-cpu"]["latency_s"] > 0 and "macs" in group
    assert merged["agreement"]["ort-cpu vs torch"]["passed"]
    assert "ort-cuda" in merged["unavailable_backends"] or "ort-cuda" in merged["measurements"]
    json.dumps(merged)


def test_progress_reports_every_step(comparison) -> None:
    _, steps = comparison
    done = [s[0] for s in steps]
    assert done == sorted(done) and steps[-1] == (steps[-1][1], steps[-1][1], "done")
    assert any("latency at batch 1" in what for _, _, what in steps)


def test_terminal_view(comparison) -> None:
    result, _ = comparison
    console = Console(record=True, width=200)
    render_comparison(result.to_dict(), console)
    text = console.export_text()
    assert "skipped ort-cuda: CUDA EP unavailable" in text or "ort-cuda" in result.runs
    assert "estimate furthest off first (ort-cpu)" in text
    assert "24/25 kernels mapped to our nodes" in text
    assert "ort-cpu vs torch" in text and "100.0%" in text
    console = Console(record=True, width=200)
    render_backends([b.to_dict() for b in list_backends()], console)
    assert "ort-cpu" in console.export_text()


# ---- small models -------------------------------------------------------------------------------

def _gemm_model(batch: int | str) -> bytes:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])], [w])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def test_batch_sweep_on_a_symbolic_batch(tmp_path: Path) -> None:
    path = tmp_path / "gemm.onnx"
    path.write_bytes(_gemm_model("batch"))
    result = compare(path, ["ort-cpu"], batches=[1, 4], memory=False, **FAST)
    sweep = result.to_dict()["measurements"]["ort-cpu"]["sweep"]
    assert [r["batch"] for r in sweep] == [1, 4]
    assert sweep[1]["throughput_per_s"] == pytest.approx(4 / sweep[1]["latency_s"]["median"])
    assert result.agreements == []  # one backend: nothing to agree with


def test_fixed_batch_needs_an_export_at_that_batch(tmp_path: Path) -> None:
    one, four = tmp_path / "b1.onnx", tmp_path / "b4.onnx"
    one.write_bytes(_gemm_model(1))
    four.write_bytes(_gemm_model(4))
    with pytest.raises(UsageError, match="fixed at batch 1"):
        compare(one, ["ort-cpu"], batches=[4], memory=False, **FAST)
    skipped = compare(one, ["ort-cpu"], batches=[1, 4], memory=False, **FAST)
    assert skipped.settings["batches"] == [1] and "batch 4 skipped" in skipped.warnings[0]
    exported = compare(ModelSpec(one, at_batch=lambda b: four), ["ort-cpu"], batches=[1, 4],
                       memory=False, **FAST)
    assert list(exported.runs["ort-cpu"].latency) == [1, 4]


def test_nothing_that_can_run_is_reported_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "gemm.onnx"
    path.write_bytes(_gemm_model(1))
    result = compare(path, ["torch"], memory=False, **FAST)
    assert result.nothing_ran and result.unavailable == {"torch": TORCH_NEEDS_MODULE}
    with pytest.raises(UsageError, match="unknown backend"):
        compare(path, ["ort-gpu"], memory=False, **FAST)
    with pytest.raises(ModelLoadError, match="cannot read an ONNX model"):
        compare(tmp_path / "missing.onnx", ["ort-cpu"], memory=False, **FAST)


@pytest.fixture(scope="module")
def linear_path(export_dir: Path) -> Path:
    import torch

    from onnxlens.exporters.torch_export import export_module

    torch.manual_seed(0)
    return export_module(torch.nn.Linear(8, 4), (torch.randn(2, 8),), export_dir / "linear.onnx")


def test_inputs_from_files_and_dump_diff_against_torch(linear_path: Path, tmp_path: Path) -> None:
    import torch

    torch.manual_seed(0)
    module = torch.nn.Linear(8, 4)
    files = []
    for i in range(3):
        files.append(tmp_path / f"x{i}.npy")
        np.save(files[-1], np.full((2, 8), i, np.float32))
    result = compare(ModelSpec(linear_path, torch_factory=lambda: module), ["ort-cpu", "torch"],
                     inputs=files, dump_diff=True, memory=False, **FAST)
    (pair,) = result.agreements
    assert pair.samples == 3 and pair.passed
    (diff,) = result.dump_diffs
    assert diff.first is None and diff.compared == 1 and "graph outputs" in diff.note
    assert "dump_diff" in result.to_dict()


def test_peak_memory_in_a_fresh_process(linear_path: Path) -> None:
    import torch

    feeds = {"input": np.zeros((2, 8), np.float32)}
    ort_bytes, why = peak_memory("ort-cpu", 1, linear_path, feeds)
    assert why == "" and ort_bytes is not None and ort_bytes >= 0
    torch_bytes, why = peak_memory("torch", 1, linear_path, feeds,
                                   functools.partial(torch.nn.Linear, 8, 4))
    assert why == "" and torch_bytes is not None and torch_bytes >= 0


def test_peak_memory_ignores_a_users_file_named_like_a_standard_module(
        linear_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `python -m` puts the current folder first on sys.path: a grp.py there (tarfile imports
    # grp, onnx imports tarfile) broke the probe, and its error hid behind a decoding error
    (tmp_path / "grp.py").write_text("raise RuntimeError('the shadowing grp.py was imported')\n")
    monkeypatch.chdir(tmp_path)
    relative = Path(os.path.relpath(linear_path, tmp_path))
    feeds = {"input": np.zeros((2, 8), np.float32)}
    peak, why = peak_memory("ort-cpu", 1, relative, feeds)
    assert why == "" and peak is not None and peak >= 0
    # a factory from the user's own module still unpickles in the probe
    (tmp_path / "user_models.py").write_text(
        "import torch\n\ndef make():\n    return torch.nn.Linear(8, 4)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_models  # type: ignore[import-not-found]

    peak, why = peak_memory("torch", 1, relative, feeds, user_models.make)
    assert why == "" and peak is not None and peak >= 0


def test_analysis_at_the_first_batch_is_reused(tmp_path: Path) -> None:
    path = tmp_path / "gemm.onnx"
    path.write_bytes(_gemm_model("batch"))
    analysis = analyze(path, batch=2)
    result = compare(path, ["ort-cpu"], batches=[2], memory=False, analysis=analysis, **FAST)
    assert result.analysis is analysis and result.runs["ort-cpu"].batch == 2
