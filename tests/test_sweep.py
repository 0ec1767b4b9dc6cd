"""`onnxlens sweep`: the spec's errors, the rows and their fields, resuming, failing models, the
local and Ray engines (a two-node `ray.cluster_utils.Cluster`: pinning, a node removed), and
the report in Chromium. Tiny MatMul+Relu models built here, whose MACs are known by hand."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_html_report import CHROMIUM, XSS, open_in_chromium
from typer.testing import CliRunner

from onnxlens.analyzer.errors import UsageError
from onnxlens.cli import app
from onnxlens.sweep import parse_spec, run_sweep
from onnxlens.sweep.engines import TIMING_SLOT
from onnxlens.sweep.results import RESULTS
from onnxlens.sweep.tasks import ROW_FIELDS, model_sha256, row_key


def _mlp(path: Path, n: int) -> Path:
    """x[N, n] @ w[n, n] -> Relu: N*n*n MACs, n*n parameters."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])
    w = numpy_helper.from_array(np.full((n, n), 0.01, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
                               helper.make_node("Relu", ["h"], ["y"])], "mlp", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what this ONNX Runtime reads
    onnx.save(model, path)
    return path


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    return {"small": _mlp(tmp_path / "small.onnx", 32), "big": _mlp(tmp_path / "big.onnx", 128),
            "bad": bad}


def _spec(*paths: Path, **extra: object) -> dict:
    return {"models": [str(p) for p in paths], "batch": [1, 4], "precision": ["fp32", "fp16"],
            "hardware": ["a100", "h100"], **extra}


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / RESULTS).read_text().splitlines()]


def _toml(spec: dict) -> str:
    def value(v: object) -> str:
        return json.dumps(v)  # lists of strings and numbers are the same in TOML

    return "".join(f"{k} = {value(v)}\n" for k, v in spec.items())


# ---- the spec -------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "message"), [
    ({"models": ["m.onnx"], "hardware": ["a100"], "batches": [1]}, "unknown key 'batches'"),
    ({"models": ["m.onnx"], "hardware": ["a100"], "batch": "8"}, "'batch' must be"),
    ({"models": ["m.onnx"], "hardware": ["a100"], "batch": [1, 0]}, "'batch' must be"),
    ({"models": ["m.onnx"], "hardware": ["a100"], "threads": True}, "'threads' must be"),
    ({"models": ["m.onnx"], "hardware": ["a100"], "precision": ["fp33"]}, "'precision' 'fp33'"),
    ({"models": ["m.onnx"], "hardware": ["a1000"]}, "'hardware' 'a1000'"),
    ({"models": ["m.onnx"], "measure": ["ort-gpu"]}, "'measure': unknown backend 'ort-gpu'"),
    ({"models": "m.onnx", "hardware": ["a100"], "dims": {"x.onnx": {"seq": 8}}},
     "'dims.x.onnx'"),
    ({"models": ["m.onnx"], "hardware": ["a100"], "dims": {"m.onnx": {"seq": -1}}},
     "'dims.m.onnx' must map dim names to integers >= 0"),
    ({"hardware": ["a100"]}, "'models' is missing"),
])
def test_spec_errors_name_the_key(spec: dict, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_spec(spec)
    assert message in str(info.value)


def test_a_dim_pinned_to_zero_is_legal_as_with_dim() -> None:
    """A prefill's empty KV cache: `--dim past_sequence_length=0` is legal, so is the spec's."""
    spec = parse_spec({"models": ["m.onnx"], "hardware": ["a100"],
                       "dims": {"m.onnx": {"past_sequence_length": 0, "sequence_length": 64}}})
    assert spec.dims == {"m.onnx": {"past_sequence_length": 0, "sequence_length": 64}}


def test_spec_error_is_one_line_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text('models = ["m.onnx"]\nhardware = ["a100"]\nrun = 3\n')
    result = CliRunner().invoke(app, ["sweep", str(tmp_path / "s.toml"), "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "unknown key 'run'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


# ---- rows, failures, resuming ----------------------------------------------------------------

def test_rows_fields_failures_and_exit_status(models: dict[str, Path], tmp_path: Path) -> None:
    """2 models x 2 batches x 2 precisions x 2 profiles = 16 estimate rows, and 8 error rows
    for the unreadable one; exit 1; MACs by hand; results.csv the same rows."""
    spec = tmp_path / "s.toml"
    spec.write_text(_toml(_spec(models["small"], models["bad"], models["big"])))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert result.exit_code == 1, result.output
    rows = _rows(out)
    assert all(list(r) == list(ROW_FIELDS) for r in rows)
    ok = [r for r in rows if r["status"] == "ok"]
    bad = [r for r in rows if r["status"] == "error"]
    assert len(ok) == 16 and len(bad) == 8, [r["error"] for r in bad][:3]
    assert {r["model"] for r in bad} == {str(models["bad"])}
    assert all("not an ONNX model" in r["error"] for r in bad)
    for r in ok:
        n = 32 if r["model"] == str(models["small"]) else 128
        assert r["macs"] == r["batch"] * n * n and r["params"] == n * n
        assert r["throughput_per_s"] == pytest.approx(r["batch"] / r["latency_s"])
        assert r["energy_j"] > 0 and r["kind"] == "estimate"
        assert set(r["host"]) == {"name", "cpu", "isa"}
    # fp16 on an A100 is faster than fp32 for the big model's GEMM (peak 312 vs 19.5 TFLOP/s)
    big = {(r["batch"], r["precision"], r["target"]): r["latency_s"] for r in ok
           if r["model"] == str(models["big"])}
    assert big[4, "fp16", "a100"] < big[4, "fp32", "a100"]
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(rows) and "host_cpu" in csv_lines[0]
    assert (out / "report.html").is_file()


def test_model_hash_read_in_chunks_is_the_files_sha256(tmp_path: Path) -> None:
    data = np.random.default_rng(0).bytes(5 << 19)  # 2.5 MiB: two whole chunks and a half
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    assert model_sha256(path) == hashlib.sha256(data).hexdigest()


def test_resume_skips_done_rows_and_reruns_errors(models: dict[str, Path],
                                                  tmp_path: Path) -> None:
    spec = parse_spec(_spec(models["small"], models["bad"]))
    out = tmp_path / "out"
    first = run_sweep(spec, out)
    assert (first.rows, first.failed, first.skipped) == (16, 8, 0)
    # a crash mid-line leaves half a row: dropped, and that row is done again
    text = (out / RESULTS).read_text()
    (out / RESULTS).write_text(text + text.splitlines()[0][:40])
    again = run_sweep(spec, out)
    assert (again.rows, again.failed, again.skipped) == (8, 8, 8)  # only the error rows
    rows = _rows(out)
    keys = [row_key(r) for r in rows]
    assert len(keys) == len(set(keys)) == 16
    assert again.exit_code == 1


def test_csv_cells_are_formula_escaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _mlp(tmp_path / "=1+1.onnx", 8)
    run_sweep(parse_spec({"models": ["=1+1.onnx"], "hardware": ["a100"]}), tmp_path / "out")
    (row,) = _rows(tmp_path / "out")
    assert row["status"] == "ok" and row["model"] == "=1+1.onnx"
    assert b"\r\n'=1+1.onnx," in (tmp_path / "out" / "results.csv").read_bytes()


def test_a_model_fixed_at_batch_1_is_swept_as_analyze_batch_sees_it(tmp_path: Path) -> None:
    """x [1, seq, 4] @ w [4, 4] with seq pinned by the spec: at batch 2 the row has what
    `analyze --batch 2 --dim seq=3` has, 2 x 3 x 4 x 4 MACs (the sweep's own pinning kept the
    fixed batch 1 and counted 48)."""
    from onnxlens import analyze

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 4])
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "m", [x], [y], [w])
    path = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    spec = parse_spec({"models": [str(path)], "batch": [2], "hardware": ["a100"],
                       "dims": {str(path): {"seq": 3}}})
    run_sweep(spec, tmp_path / "out")
    (row,) = _rows(tmp_path / "out")
    assert row["status"] == "ok", row["error"]
    assert row["macs"] == analyze(path, batch=2, dims={"seq": 3}).totals["macs"] == 2 * 3 * 16


def test_measured_row_at_the_models_precision(models: dict[str, Path], tmp_path: Path) -> None:
    spec = parse_spec({"models": [str(models["big"])], "batch": [2], "measure": ["ort-cpu"],
                       "runs": 3, "warmup": 1})
    run_sweep(spec, tmp_path / "out")
    (row,) = _rows(tmp_path / "out")
    assert row["status"] == "ok", row["error"]
    assert (row["kind"], row["target"], row["precision"]) == ("measured", "ort-cpu", "fp32")
    assert row["macs"] == 2 * 128 * 128
    assert 0 < row["latency_s"] < 1 and row["peak_memory_bytes"] > 128 * 128 * 4


def test_a_kv_cache_models_measured_row_has_the_head_dim_the_analysis_read(
        tmp_path: Path) -> None:
    """The genai decoder of tests/data/genai with only its lengths pinned: the analysis reads
    the cache's head size, 16, from GroupQueryAttention (`--dim kv_cache_dim=16 added`), and
    the measurement feeds caches of that size; without it the dim is left at 1 and ORT refuses
    the inputs ('past_key dimension 3 should match the packed KV head dimension'). MACs of
    one new token over 7 cached, by hand (test_genai.py): 20480 + 128 x 8 = 21504."""
    model = Path(__file__).parent / "data" / "genai" / "fp32" / "model.onnx"
    lengths = {"batch_size": 1, "sequence_length": 1, "past_sequence_length": 7,
               "total_sequence_length": 8}
    spec = parse_spec({"models": [str(model)], "batch": [1], "measure": ["ort-cpu"],
                       "runs": 1, "warmup": 0, "dims": {str(model): lengths}})
    run_sweep(spec, tmp_path / "out")
    (row,) = _rows(tmp_path / "out")
    assert row["status"] == "ok", row["error"]
    assert row["kind"] == "measured" and row["macs"] == 21504


def test_quantized_model_estimated_at_its_own_precision(models: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """The default precision is the graph's own: a quantize_dynamic model's estimate rows are
    ok, its measurement says int8 and pairs with them in the report; an explicit fp32 what-if
    of it is an error row that still carries the model's figures."""
    from onnxruntime.quantization import quantize_dynamic

    from onnxlens.reports.sweep_html import _accuracy

    q = tmp_path / "q.onnx"
    quantize_dynamic(models["big"], q)
    spec = {"models": [str(q)], "batch": [2], "hardware": ["host"], "measure": ["ort-cpu"],
            "runs": 3, "warmup": 1}
    run_sweep(parse_spec(spec), tmp_path / "out")
    rows = {r["kind"]: r for r in _rows(tmp_path / "out")}
    assert rows["estimate"]["status"] == "ok", rows["estimate"]["error"]
    assert rows["estimate"]["precision"] == "graph" and rows["measured"]["precision"] == "int8"
    assert rows["estimate"]["macs"] == rows["measured"]["macs"] == 2 * 128 * 128
    assert "of 1 estimates within 25%" in _accuracy(list(rows.values()))

    run_sweep(parse_spec({**spec, "precision": ["graph", "fp32"], "measure": []}),
              tmp_path / "what-if")
    by_precision = {r["precision"]: r for r in _rows(tmp_path / "what-if")}
    assert by_precision["graph"]["status"] == "ok"
    failed = by_precision["fp32"]
    assert failed["status"] == "error" and "int8" in failed["error"]
    assert (failed["macs"], failed["params"]) == (2 * 128 * 128, by_precision["graph"]["params"])


# ---- the report ------------------------------------------------------------------------------

@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_report_in_chromium(models: dict[str, Path], tmp_path: Path) -> None:
    hostile = _mlp(tmp_path / f"{XSS}.onnx", 16)
    out = tmp_path / "out"
    run_sweep(parse_spec(_spec(models["small"], hostile, models["big"], models["bad"])), out)
    (out / "report.html").unlink()
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    page = out / "report.html"
    assert XSS not in page.read_text()  # escaped in the source

    def use(p: object, _start: float) -> dict:
        # all of main's text: sections off screen are not rendered (content-visibility)
        return {"svgs": p.eval_on_selector_all("svg.chart", "s => s.length"),
                "main": p.text_content("main")}

    seen = open_in_chromium(page, tmp_path / "sweep.png", use)
    assert seen["errors"] == [] and seen["dialogs"] == [] and seen["images"] == 0
    assert seen["requests"] == [page.as_uri()]
    for text in ("Latency, models × targets", "Latency against MACs",
                 "Throughput against batch", "Precision and hardware", "Failed rows (8)", XSS):
        assert text in seen["main"]
    assert seen["svgs"] == 4  # latency vs MACs and throughput, on each of 2 profiles


def _order(row: dict) -> str:
    return str(row_key(row))


# ---- Ray -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    """A head with no CPU and two one-CPU nodes labelled node_a and node_b, each with its
    timing slot; shared by the Ray tests (start-up costs seconds)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = {label: c.add_node(num_cpus=1, resources={label: 1, TIMING_SLOT: 1})
             for label in ("node_a", "node_b")}
    ray.init(address=c.address, log_to_driver=False)
    yield c, {label: n.node_id for label, n in nodes.items()}
    ray.shutdown()
    c.shutdown()


def test_ray_estimates_equal_local_and_pinning(cluster: tuple, models: dict[str, Path],
                                               tmp_path: Path) -> None:
    _, node_ids = cluster
    base = _spec(models["small"], models["big"])
    run_sweep(parse_spec(base), tmp_path / "local")
    spec = parse_spec(base | {"measure": ["ort-cpu"], "runs": 3, "warmup": 1,
                              "resources": {"ort-cpu": "node_b"}})
    outcome = run_sweep(spec, tmp_path / "ray", engine="ray")
    assert outcome.failed == 0
    ray_rows = _rows(tmp_path / "ray")
    estimates = [r for r in ray_rows if r["kind"] == "estimate"]
    assert sorted(estimates, key=_order) == sorted(_rows(tmp_path / "local"), key=_order)
    measured = [r for r in ray_rows if r["kind"] == "measured"]
    assert len(measured) == 4
    assert {r["host"]["node"] for r in measured} == {node_ids["node_b"]}


def test_ray_missing_label_is_an_error_row(cluster: tuple, models: dict[str, Path],
                                           tmp_path: Path) -> None:
    spec = parse_spec({"models": [str(models["small"])], "measure": ["ort-cpu"],
                       "resources": {"ort-cpu": "h100_box"}})
    outcome = run_sweep(spec, tmp_path / "out", engine="ray")
    (row,) = _rows(tmp_path / "out")
    assert outcome.exit_code == 1
    assert row["status"] == "error" and "h100_box" in row["error"]


def test_ray_node_removed_mid_sweep(cluster: tuple, models: dict[str, Path],
                                    tmp_path: Path) -> None:
    """Two measurements pinned to node_c; node_c leaves after the first: the sweep still ends,
    the second row an error naming the resource no node has any more."""
    c, _ = cluster
    node_c = c.add_node(num_cpus=1, resources={"node_c": 1, TIMING_SLOT: 1})
    c.wait_for_nodes()
    removed = threading.Event()

    def progress(done: int, _total: int, _failed: int) -> None:
        if done == 1 and not removed.is_set():
            removed.set()
            c.remove_node(node_c)

    spec = parse_spec({"models": [str(models["small"])], "batch": [1, 2],
                       "measure": ["ort-cpu"], "runs": 200, "warmup": 1,
                       "resources": {"ort-cpu": "node_c"}})
    outcome = run_sweep(spec, tmp_path / "out", engine="ray", progress=progress)
    rows = _rows(tmp_path / "out")
    assert removed.is_set() and len(rows) == 2
    assert rows[0]["status"] == "ok"
    assert rows[1]["status"] == "error" and "node_c" in rows[1]["error"]
    assert outcome.exit_code == 1
