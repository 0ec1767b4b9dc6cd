"""Hostile strings from a model: names, op types, doc strings and metadata reach every report
harmless (HTML escaped, CSV formulas neutralized, terminal control characters removed and long
names shortened), and an error message naming such a node stays one clean line."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

import onnxlens
from onnxlens.analyzer.analysis import AnalysisResult
from onnxlens.reports.html import render_html
from onnxlens.reports.terminal import MAX_NAME, render

vi = helper.make_tensor_value_info

HTML_TAG = "<img src=x onerror=alert(1)>"
HTML_ATTRIBUTE = 'x" onmouseover="alert(1)'
FORMULAS = ['=HYPERLINK("http://evil.example","x")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)"]
CONTROL = "\x1b[2J\x1b[31mred\x07\rover\u202eevil\x00"
MARKUP = "[bold red]not markup[/]"
LONG = "n" * 5000
NAMES = [HTML_TAG, HTML_ATTRIBUTE, *FORMULAS, CONTROL, MARKUP, LONG]
SCRIPT = "<script>alert('doc')</script>"
GRAPH_NAME = "<script>alert('name')</script>\x1b[2J"
CUSTOM_OP = "<svg onload=alert(1)>"


def hostile_model() -> onnx.ModelProto:
    """x -> Relu named after each hostile string -> ... -> a custom op -> y; doc strings and
    metadata hold markup too. The graph input and output carry hostile names as well."""
    names = [*NAMES]
    nodes, previous = [], LONG + "_in"
    for i, name in enumerate(names):
        out = f"t{i}"
        nodes.append(helper.make_node("Relu", [previous], [out], name=name, doc_string=SCRIPT))
        previous = out
    nodes.append(helper.make_node(CUSTOM_OP, [previous], [HTML_TAG + "_out"], name="custom",
                                  domain="com.acme"))
    graph = helper.make_graph(nodes, GRAPH_NAME, [vi(LONG + "_in", TensorProto.FLOAT, [1, 8])],
                              [vi(HTML_TAG + "_out", TensorProto.FLOAT, [1, 8])],
                              doc_string=SCRIPT)
    model = helper.make_model(graph, doc_string=SCRIPT, producer_name=SCRIPT,
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("com.acme", 1)])
    helper.set_model_props(model, {f"<b>{CONTROL}": FORMULAS[0], "license": SCRIPT})
    return model


@pytest.fixture(scope="module")
def result() -> AnalysisResult:
    return onnxlens.analyze(hostile_model().SerializeToString())


def test_the_names_survive_the_analysis(result: AnalysisResult) -> None:
    names = [n["name"] for n in result.to_dict()["nodes"]]
    assert names[: len(NAMES)] == NAMES
    assert result.model.name == GRAPH_NAME
    assert any("com.acme" in w for w in result.warnings)


def test_html_escapes_every_model_string(result: AnalysisResult) -> None:
    page = render_html(result.to_dict())
    assert HTML_TAG not in page and CUSTOM_OP not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert 'onmouseover="alert' not in page and "x&quot; onmouseover=&quot;alert(1)" in page
    assert page.count("<script") == 1  # the report's own sorting script
    assert "&lt;script&gt;alert(&#x27;name&#x27;)&lt;/script&gt;" in page
    assert "alert('doc')" not in page and "evil.example" in page  # doc strings are not shown


def test_csv_quotes_cells_a_spreadsheet_would_run(result: AnalysisResult) -> None:
    for level in ("nodes", "groups"):
        rows = list(csv.DictReader(io.StringIO(result.to_csv(level=level))))
        for row in rows:
            for column, cell in row.items():
                if cell.startswith(("=", "+", "-", "@", "\t", "\r")):
                    pytest.fail(f"{level} {column}: {cell!r} would run as a formula")
        cells = {row["name"] if level == "nodes" else row["nodes"] for row in rows}
        for formula in FORMULAS:
            assert any(c.startswith("'" + formula) for c in cells), formula


def _terminal(result: AnalysisResult) -> str:
    out = io.StringIO()
    render(result.to_dict(), Console(file=out, width=300, color_system=None, highlight=False),
           top=len(NAMES) + 2)
    return out.getvalue()


def test_terminal_removes_control_characters(result: AnalysisResult) -> None:
    text = _terminal(result)
    for char in ("\x1b", "\x07", "\r", "\x00", "\u202e"):
        assert char not in text, repr(char)
    assert "[2J" in text and "red" in text  # what is left of the escape sequences is visible
    assert MARKUP in text  # printed as written, not interpreted


def test_terminal_shortens_long_names(result: AnalysisResult) -> None:
    text = _terminal(result)
    assert "n" * MAX_NAME not in text
    assert "n" * (MAX_NAME - 1) + "…" in text
    assert max(len(line) for line in text.splitlines()) <= 300


def test_json_keeps_strings_as_data(result: AnalysisResult) -> None:
    d = json.loads(result.to_json())
    assert d["model"]["name"] == GRAPH_NAME
    assert [n["name"] for n in d["nodes"]][: len(NAMES)] == NAMES
    assert d["model"]["metadata"]["license"] == SCRIPT  # exported as data, escaped in HTML
    assert "alert('doc')" not in json.dumps([n for n in d["nodes"]])  # doc strings are not


def test_error_naming_a_hostile_node_is_one_clean_line(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name=CONTROL + MARKUP + LONG,
                            strides=[0, 1])
    graph = helper.make_graph([node], "g", [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [vi("y", TensorProto.FLOAT, [None] * 4)], [w])
    path = tmp_path / "model.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    code = "from onnxlens.cli import analyze_main; analyze_main()"
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, timeout=120, env={"COLUMNS": "80", "PATH": ""})
    assert out.returncode != 0 and "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: node ")
    for char in ("\x1b", "\x07", "\r", "\x00", "\u202e"):
        assert char not in lines[0], repr(char)
    assert MARKUP in lines[0] and len(lines[0]) <= 520
