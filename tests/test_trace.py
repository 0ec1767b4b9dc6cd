"""`compare --trace`: the measured per-group timeline in Chrome's Trace Event Format, checked
against the format's fields (catapult's Trace Event Format document), the comparison's own
per-group and per-kernel times, and hostile node names."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxlens.backends.compare import Comparison, compare
from onnxlens.backends.trace import write_trace
from onnxlens.cli import app

FAST = {"runs": 3, "warmup": 1, "profile_runs": 2, "samples": 1, "memory": False}
HOSTILE = 'conv "1"</script><img src=x>\\\n\u2028'


def _small_cnn(path: Path) -> Path:
    """Conv+Relu, Conv, GlobalAveragePool, Flatten, Gemm: several groups, one named HOSTILE."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name=HOSTILE, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wf"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [weight("w1", 16, 3, 3, 3), weight("w2", 16, 16, 3, 3), weight("wf", 10, 16)])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Comparison, dict]:
    folder = tmp_path_factory.mktemp("trace")
    result = compare(_small_cnn(folder / "cnn.onnx"), ["ort-cpu"], **FAST)
    trace_path = folder / "cnn.trace.json"
    count = write_trace(result, trace_path)
    doc = json.loads(trace_path.read_text(encoding="utf-8"))  # strict: no raw control chars
    assert count == sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
    return result, doc


def _track(doc: dict, name: str) -> list[dict]:
    """The complete events of the track (thread) named `name`, in file order."""
    (tid,) = [e["tid"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["name"] == "thread_name" and e["args"]["name"] == name]
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == tid]


def test_the_document_has_the_trace_event_format_fields(measured) -> None:
    _, doc = measured
    assert set(doc) == {"traceEvents", "displayTimeUnit"}
    assert doc["displayTimeUnit"] in ("ms", "ns")  # the two units the format allows
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M")
        assert isinstance(e["name"], str) and isinstance(e["pid"], int)
        assert isinstance(e["tid"], int) and isinstance(e["args"], dict)
        if e["ph"] == "X":  # a complete event: category, start and duration in microseconds
            assert isinstance(e["cat"], str)
            assert isinstance(e["ts"], float | int) and e["ts"] >= 0
            assert isinstance(e["dur"], float | int) and e["dur"] >= 0
        else:  # metadata naming the process and its tracks
            assert e["name"] in ("process_name", "thread_name")
            assert isinstance(e["args"]["name"], str)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"ort-cpu: groups", "ort-cpu: kernels"}


def test_one_event_per_group_in_execution_order_end_to_end(measured) -> None:
    result, doc = measured
    groups = result.analysis.groups
    events = _track(doc, "ort-cpu: groups")
    assert [e["args"]["group"] for e in events] == [g.id for g in groups]
    assert [e["name"] for e in events] == [f"{g.pattern} {g.nodes[0]}" for g in groups]
    assert events[0]["ts"] == 0
    for before, after in itertools.pairwise(events):
        assert before["ts"] + before["dur"] <= after["ts"]  # no overlap
        assert after["ts"] == pytest.approx(before["ts"] + before["dur"], abs=1e-9)  # no gap
    times = result.runs["ort-cpu"].times
    assert times is not None
    total_us = sum(e["dur"] for e in events)
    assert total_us == pytest.approx(sum(times.group_s.values()) * 1e6, rel=1e-12)
    # The groups add up to the measured latency less the unmapped kernels' share.
    latency = result.runs["ort-cpu"].latency_s
    assert total_us == pytest.approx(latency * (1 - times.unmapped_share) * 1e6, rel=1e-9)


def test_group_args_hold_macs_and_the_host_estimate(measured) -> None:
    result, doc = measured
    by_id = {e["args"]["group"]: e["args"] for e in _track(doc, "ort-cpu: groups")}
    conv_relu = next(g for g in result.analysis.groups if g.nodes[0] == HOSTILE)
    args = by_id[conv_relu.id]
    assert args["pattern"] == "Conv+Relu" and args["nodes"] == [HOSTILE, "relu1"]
    assert args["macs"] == 16 * 32 * 32 * 3 * 3 * 3  # C_out·H·W·C_in·kh·kw, pads keep 32x32
    fc = next(g for g in result.analysis.groups if g.nodes == ("fc",))
    assert by_id[fc.id]["macs"] == 16 * 10
    estimate = result.runs["ort-cpu"].estimate
    assert estimate is not None
    for gid, a in by_id.items():
        assert a["measured_s"] == result.runs["ort-cpu"].times.group_s[gid]
        assert a["estimated_s"] == estimate.groups[gid].latency_s
        assert a["hardware"] == "host"


def test_kernel_track_is_the_profile_scaled_to_the_latency(measured) -> None:
    result, doc = measured
    times = result.runs["ort-cpu"].times
    events = _track(doc, "ort-cpu: kernels")
    assert [e["name"] for e in events] == [k.name for k in times.kernels]
    for before, after in itertools.pairwise(events):
        assert before["ts"] + before["dur"] <= after["ts"]
    assert sum(e["dur"] for e in events) == pytest.approx(times.latency_s * 1e6, rel=1e-12)
    profiled = sum(k.duration_s for k in times.kernels)
    for e, k in zip(events, times.kernels, strict=True):
        assert e["dur"] == pytest.approx(k.duration_s / profiled * times.latency_s * 1e6)


def test_hostile_names_are_json_data(measured) -> None:
    _, doc = measured
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    # Quotes, backslash, newline, U+2028 and markup parse back exactly: escaped, not cut.
    assert f"Conv+Relu {HOSTILE}" in [e["name"] for e in events]
    assert any(HOSTILE in e["args"]["nodes"] for e in events if e["cat"] == "kernel")


def test_cli_compare_and_analyze_write_the_trace(tmp_path: Path) -> None:
    model = _small_cnn(tmp_path / "m.onnx")
    for command in (["compare", str(model), "--runs", "2", "--warmup", "0", "--samples", "1"],
                    ["analyze", str(model), "--measure", "ort-cpu", "--runs", "2"]):
        out = tmp_path / f"{command[0]}.json"
        result = CliRunner().invoke(app, [*command, "--trace", str(out)], terminal_width=200)
        assert result.exit_code == 0, result.output
        assert f"wrote {out}" in result.output.replace("\n", "")
        doc = json.loads(out.read_text(encoding="utf-8"))
        groups = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "group"]
        assert len(groups) == 5  # Conv+Relu, Conv, GlobalAveragePool, Flatten, Gemm


def test_analyze_trace_without_measure_is_one_line(tmp_path: Path) -> None:
    model = _small_cnn(tmp_path / "m.onnx")
    result = CliRunner().invoke(app, ["analyze", str(model), "--trace", str(tmp_path / "t")])
    assert result.exit_code != 0
    assert "--trace" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "t").exists()
