"""The JSON writer (orjson) against the stdlib encoder it replaced: parsed, the same document.

The old writer was ``json.dumps(d, indent=1)``; each case parses both outputs and compares them,
on analyses of several models (hand-made, hostile names, a chain with estimates, one past the
indentation threshold) and on the values orjson refuses (a 70-bit int, a lone surrogate).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import onnxlens
from onnxlens.analyzer.hardware import load_profile
from onnxlens.analyzer.serialize import INDENT_MAX_BYTES, dump_json

sys.path.insert(0, str(Path(__file__).parent / "bad_inputs"))
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from chain import chain_model
from test_api import tiny_model
from test_hostile_strings import hostile_model


def _old(d: dict[str, Any]) -> Any:
    return json.loads(json.dumps(d, indent=1))


def _chain_with_estimates() -> dict[str, Any]:
    result = onnxlens.analyze(chain_model(60))
    result.add_estimate(load_profile("a100"))
    result.add_estimate(load_profile("epyc_9654"), "fp16")
    return result.to_dict()


CASES = {
    "tiny": lambda: onnxlens.analyze(tiny_model()).to_dict(),
    "hostile names": lambda: onnxlens.analyze(hostile_model()).to_dict(),
    "chain with estimates": _chain_with_estimates,
}


@pytest.mark.parametrize("case", CASES)
def test_same_document_as_the_stdlib_writer(case: str, tmp_path: Path) -> None:
    d = CASES[case]()
    out = tmp_path / "out.json"
    text = dump_json(d, out)
    assert json.loads(text) == json.loads(out.read_text(encoding="utf-8")) == _old(d)
    assert text.startswith('{\n  "schema": "onnxlens/1"')  # small: indented, two spaces


def test_large_output_is_compact_and_the_same_document() -> None:
    d = onnxlens.analyze(chain_model(6000)).to_dict()
    text = dump_json(d)
    assert len(text) > INDENT_MAX_BYTES and "\n" not in text
    assert json.loads(text) == _old(d)


@pytest.mark.parametrize("value", [2**70, -(2**64), "a\udc80b", {3: "int key"}])
def test_values_orjson_refuses_go_through_the_stdlib(value: Any) -> None:
    d = {"schema": "onnxlens/1", "value": value}
    assert json.loads(dump_json(d)) == _old(d)
