"""The Python API, the JSON/CSV contract, memory liveness and the CLI, on a tiny hand-made model.

Tiny model: x[1,3,8,8] -> Conv(W[4,3,3,3], B[4], pad 1) -> Relu -> GlobalAveragePool
-> Flatten -> Gemm(W[10,4], B[10], transB) -> y[1,10]. Every figure below is derived by hand.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.fusion import Group
from onnxlens.analyzer.graph import build_graph
from onnxlens.analyzer.loader import load_model
from onnxlens.analyzer.memory import activation_peak_bytes
from onnxlens.analyzer.serialize import safe_cell

CONV_MACS = 1 * 4 * 8 * 8 * 3 * 3 * 3  # N*M*H*W outputs x (C/group * kh * kw) = 6912
GEMM_MACS = 1 * 10 * 4  # M*N*K = 40
PARAMS = 4 * 3 * 3 * 3 + 4 + 10 * 4 + 10  # conv W, conv B, fc W, fc B = 162


def tiny_model(conv_name: str = "conv") -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in
             (("w", (4, 3, 3, 3)), ("b", (4,)), ("fw", (10, 4)), ("fb", (10,)))]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name=conv_name, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture()
def tiny_path(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), path)
    return path


def test_totals_match_hand_derivation(tiny_path: Path) -> None:
    result = onnxlens.analyze(tiny_path)
    t = result.totals
    assert t["macs"] == CONV_MACS + GEMM_MACS
    assert t["params"] == PARAMS
    assert t["param_bytes"] == 4 * PARAMS
    assert t["nodes"] == 5
    assert t["complete"] is True
    assert t["flops"] >= 2 * (CONV_MACS + GEMM_MACS)


def test_conv_node_bytes_and_params(tiny_path: Path) -> None:
    node = next(n for n in onnxlens.analyze(tiny_path).to_dict()["nodes"] if n["name"] == "conv")
    assert node["bytes_read"] == 4 * (3 * 8 * 8 + 4 * 3 * 3 * 3 + 4)  # x, W, B
    assert node["bytes_written"] == 4 * (4 * 8 * 8)
    assert node["params"] == 4 * 3 * 3 * 3 + 4
    assert node["output_shapes"] == [[1, 4, 8, 8]]


def test_nodes_alike_share_a_cost_and_nodes_unlike_do_not() -> None:
    """Node costs are computed once per op, attributes, constant inputs and tensor types and
    shapes (`analysis._node_costs`): the second Conv, alike, costs what the first does; one
    with other pads, one reading a larger input and a Mul reading x twice (after a Mul of x
    and another tensor of its shape) are costed on their own. By hand, per Conv of w[2,2,1,1]
    and b[2]: 1·2·H·W outputs x 2 MACs; bytes: its input, w and b read, its output written;
    the Mul of x by itself reads x once (its bytes count once)."""
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    b = numpy_helper.from_array(np.zeros(2, np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c1"], name="c1"),
             helper.make_node("Conv", ["c1", "w", "b"], ["c2"], name="c2"),
             helper.make_node("Conv", ["c2", "w", "b"], ["c3"], name="c3", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c3", "w", "b"], ["c4"], name="c4"),
             helper.make_node("Mul", ["x", "c1"], ["xc"], name="xc"),
             helper.make_node("Mul", ["x", "x"], ["sq"], name="sq")]
    graph = helper.make_graph(nodes, "alike",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None] * 4)
                               for o in ("c4", "xc", "sq")], [w, b])
    result = onnxlens.analyze(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    rows = {n["name"]: n for n in result.to_dict()["nodes"]}

    def conv(side_in: int, side_out: int) -> tuple[int, int, int]:  # MACs, bytes read, written
        return (2 * side_out**2 * 2, 4 * (2 * side_in**2 + 4 + 2), 4 * 2 * side_out**2)

    assert [(rows[k]["macs"], rows[k]["bytes_read"], rows[k]["bytes_written"])
            for k in ("c1", "c2", "c3", "c4")] == [conv(4, 4), conv(4, 4), conv(4, 6), conv(6, 6)]
    assert (rows["xc"]["bytes_read"], rows["sq"]["bytes_read"]) == (4 * 64, 4 * 32)
    costs = result.node_costs
    assert costs["c1"] is costs["c2"]  # alike: one computation
    assert costs["c3"] is not costs["c1"] and costs["c4"] is not costs["c3"]


def test_same_result_from_path_bytes_and_proto(tiny_path: Path) -> None:
    a = onnxlens.analyze(tiny_path).totals
    b = onnxlens.analyze(tiny_path.read_bytes()).totals
    c = onnxlens.analyze(tiny_model()).totals
    assert a == b == c


def test_flops_per_mac_convention(tiny_path: Path) -> None:
    two = onnxlens.analyze(tiny_path).totals["flops"]
    one = onnxlens.analyze(tiny_path, flops_per_mac=1).totals["flops"]
    assert two - one == CONV_MACS + GEMM_MACS


def test_activation_peak_by_liveness(tiny_path: Path) -> None:
    mg = build_graph(load_model(tiny_path))
    x, c, r = 4 * 3 * 64, 4 * 4 * 64, 4 * 4 * 64
    singletons = [Group(i, "", (k,)) for i, k in enumerate(mg.order)]
    # Unfused: at Relu both its input c and output r are live; x died after the Conv.
    assert activation_peak_bytes(mg, singletons, load_model(tiny_path).tensors) == max(x + c, c + r)
    fused = [Group(0, "Conv+Relu", tuple(mg.order[:2])),
             *(Group(i, "", (k,)) for i, k in enumerate(mg.order[2:], start=1))]
    # Fused: c never materializes, so the peak is x + r at the fused kernel.
    assert activation_peak_bytes(mg, fused, load_model(tiny_path).tensors) == x + r


def test_json_contract(tiny_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    onnxlens.analyze(tiny_path).to_json(out)
    d = json.loads(out.read_text())
    assert d["schema"] == "onnxlens/1"
    assert {"name", "path", "opset", "inputs", "outputs"} <= set(d["model"])
    assert d["model"]["opset"] == 17
    assert d["model"]["inputs"] == [{"name": "x", "dtype": "float", "shape": [1, 3, 8, 8]}]
    assert {"macs", "flops", "params", "param_bytes", "activation_peak_bytes", "nodes",
            "groups"} <= set(d["totals"])
    node_keys = {"name", "op_type", "group", "macs", "flops", "bytes_read", "bytes_written",
                 "params", "output_shapes"}
    assert all(node_keys <= set(n) for n in d["nodes"])
    group_keys = {"id", "pattern", "nodes", "macs", "flops", "bytes_read", "bytes_written"}
    assert all(group_keys <= set(g) for g in d["groups"])
    assert sorted(n for g in d["groups"] for n in g["nodes"]) == sorted(n["name"]
                                                                       for n in d["nodes"])
    assert sum(g["macs"] for g in d["groups"]) == d["totals"]["macs"]
    assert d["unsupported_ops"] == {} and isinstance(d["warnings"], list)


def _matmul_chain(widths: list[int]) -> onnx.ModelProto:
    """x [1, widths[0]] through one MatMul per step: MatMul i has widths[i] x widths[i+1] MACs."""
    inits = [numpy_helper.from_array(np.ones((a, b), np.float32), f"w{i}")
             for i, (a, b) in enumerate(pairwise(widths))]
    nodes = [helper.make_node("MatMul", [f"t{i}", f"w{i}"], [f"t{i + 1}"], name=f"mm{i}")
             for i in range(len(inits))]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, widths[0]])],
        [helper.make_tensor_value_info(f"t{len(inits)}", TensorProto.FLOAT, [1, widths[-1]])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("hardware", [[], ["a100"]])
def test_the_summary_dict_holds_the_groups_it_lists(hardware: list[str]) -> None:
    """`to_dict(top_groups=N)` builds only the N group rows the terminal lists (by FLOPs, or
    time on the first profile; ties in model order), and the terminal prints the same."""
    from rich.console import Console

    from onnxlens.reports.terminal import render

    # MACs per MatMul: 4x8=32, 8x8=64, 8x8=64, 8x2=16
    result = onnxlens.analyze(_matmul_chain([4, 8, 8, 8, 2]), hardware=hardware)
    full = result.to_dict(nodes=False)
    for top, ids in ((1, [1]), (2, [1, 2]), (3, [0, 1, 2]), (9, [0, 1, 2, 3])):
        shown = result.to_dict(nodes=False, top_groups=top)
        assert [g["id"] for g in shown["groups"]] == ids
        assert [g for g in full["groups"] if g["id"] in ids] == shown["groups"]
        assert [g["macs"] for g in shown["groups"]] == [[32, 64, 64, 16][i] for i in ids]
        texts = []
        for d in (full, shown):
            console = Console(file=io.StringIO(), width=200, color_system=None)
            render(d, console, top=top)
            texts.append(console.file.getvalue())
        assert texts[0] == texts[1] and f"(top {len(ids)} of 4)" in texts[1]


def test_csv_rows_and_formula_injection(tmp_path: Path) -> None:
    path = tmp_path / "evil.onnx"
    onnx.save(tiny_model(conv_name="=HYPERLINK(\"http://x\")"), path)
    text = onnxlens.analyze(path).to_csv()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 5
    assert rows[0]["name"] == "'=HYPERLINK(\"http://x\")"
    assert int(rows[0]["macs"]) == CONV_MACS
    assert safe_cell("-1") == "'-1" and safe_cell("@a") == "'@a" and safe_cell(3) == 3


def test_dataframes(tiny_path: Path) -> None:
    pytest.importorskip("pandas")
    result = onnxlens.analyze(tiny_path)
    nodes, groups = result.nodes_frame(), result.groups_frame()
    assert len(nodes) == 5 and int(nodes["macs"].sum()) == CONV_MACS + GEMM_MACS
    assert int(groups["macs"].sum()) == CONV_MACS + GEMM_MACS


def test_unknown_op_is_reported_not_zero(tmp_path: Path) -> None:
    model = tiny_model()
    model.graph.node[1].op_type = "MysteryOp"
    model.graph.node[1].domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    result = onnxlens.analyze(model)
    assert result.unsupported_ops == {"com.example::MysteryOp": ["relu"]}
    assert result.node_costs["relu"].cost is None
    assert result.totals["complete"] is False
    assert any("MysteryOp" in w for w in result.warnings)
    with pytest.raises(onnxlens.OnnxLensError, match="MysteryOp"):
        onnxlens.analyze(model, strict=True)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from onnxlens.cli import analyze_main; analyze_main()"
    env = {**os.environ, "COLUMNS": "250"}  # wide enough that no cell wraps
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_cli_writes_json_and_csv(tiny_path: Path, tmp_path: Path) -> None:
    out = _cli(str(tiny_path), "--json", str(tmp_path / "a.json"), "--csv",
               str(tmp_path / "a.csv"))
    assert out.returncode == 0, out.stderr
    assert "tiny" in out.stdout and "MACs" in out.stdout
    assert json.loads((tmp_path / "a.json").read_text())["totals"]["macs"] == 6952
    assert (tmp_path / "a_groups.csv").read_text().startswith("id,pattern,nodes")


def test_cli_prints_hostile_names_as_text(tmp_path: Path) -> None:
    path = tmp_path / "markup.onnx"
    onnx.save(tiny_model(conv_name="[red]boom[/red]\x1b[2J"), path)
    out = _cli(str(path), "--top", "5")
    assert out.returncode == 0, out.stderr
    assert "[red]boom[/red]?[2J" in out.stdout.replace("\n", "")
    assert "\x1b[2J" not in out.stdout


def test_cli_error_is_one_line(tmp_path: Path) -> None:
    out = _cli(str(tmp_path / "missing.onnx"))
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "missing.onnx" in lines[0]


def test_cli_model_alone_skips_parsing_but_runs_the_same_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`analyze MODEL` alone is not parsed by typer: the call it makes is typer's, exit code too."""
    import onnxlens.cli as cli

    calls = []
    monkeypatch.setattr(cli, "_run", lambda *args, **kwargs: calls.append((args, kwargs)))
    codes = []
    for argv in (["analyze", "m.onnx"], ["analyze", "m.onnx", "--top", "10"]):
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as exit_:
            cli.analyze_main()
        codes.append(exit_.value.code)
    assert calls[0] == calls[1] and codes == [0, 0]


@pytest.mark.parametrize("options", [[], ["--json", "a.json", "--top", "3"]])
def test_analyze_program_ends_holding_its_result(tiny_path: Path, tmp_path: Path,
                                                 options: list[str]) -> None:
    """As the `analyze` program (a launcher file importing analyze_main), with or without
    options, the process ends by os._exit once the summary and files are written: Python's
    exit handlers, which a normal exit runs, do not run; what it wrote is all there."""
    launcher = tmp_path / "analyze_launcher.py"
    launcher.write_text("import atexit\nfrom onnxlens.cli import analyze_main\n"
                        "atexit.register(print, 'exit handlers ran')\nanalyze_main()\n")
    out = subprocess.run([sys.executable, str(launcher), str(tiny_path), *options],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "COLUMNS": "250"})
    assert out.returncode == 0, out.stderr
    assert "MACs" in out.stdout and "exit handlers ran" not in out.stdout
    if options:
        assert json.loads((tmp_path / "a.json").read_text())["totals"]["macs"] == 6952


def test_cli_model_alone_exit_code_of_an_error(tmp_path: Path) -> None:
    assert _cli(str(tmp_path / "missing.onnx")).returncode == \
        _cli(str(tmp_path / "missing.onnx"), "--top", "10").returncode == 2
