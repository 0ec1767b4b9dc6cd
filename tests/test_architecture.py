"""The layer table of ARCHITECTURE.md, enforced on every import statement of the source."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Package folder -> what of onnxlens it may import (itself always allowed): a package, or one
# module of a package (`analyzer.errors`: that module and nothing else of the analyzer).
ALLOWED = {
    "analyzer": set(),
    "exporters": {"analyzer.errors", "analyzer.fold"},
    "backends": {"analyzer"},
    "reports": {"analyzer"},
    "onnxlens": {"analyzer", "exporters", "backends", "reports"},
}
# Inside analyzer/: a module may import only modules of an earlier or its own rank (ARCHITECTURE.md
# lists them line by line; `test_architecture_md_says_the_same` checks that it agrees).
ANALYZER_RANK = {"errors": 1, "ir": 1, "validate": 2, "fold": 2, "loader": 2, "graph": 3,
                 "cost": 4, "hardware": 4, "host": 4, "fusion": 5, "invariants": 5,
                 "calibration": 5, "runtimes": 5, "memory": 6, "symbolic": 6, "estimate": 6,
                 "whatif": 6, "llm": 6, "analysis": 7, "serialize": 7, "sweep": 8}


def _imports(path: Path, package: str) -> list[tuple[str, int]]:
    """(absolute onnxlens-relative target, line) for each import in the file, lazy ones too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel_parts = path.relative_to(ROOT / package).with_suffix("").parts
    here = [package, *rel_parts[:-1]]  # the module's package, as path parts
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                target = [*base, *(node.module.split(".") if node.module else [])]
                names = [target] if node.module else [[*base, a.name] for a in node.names]
                found += [(".".join(t), node.lineno) for t in names]
            elif node.module and node.module.startswith("onnxlens"):
                found.append((".".join(_strip(node.module.split("."))), node.lineno))
        elif isinstance(node, ast.Import):
            found += [(".".join(_strip(a.name.split("."))), node.lineno) for a in node.names
                      if a.name.startswith("onnxlens")]
    return found


def _strip(parts: list[str]) -> list[str]:
    """`onnxlens.analyzer.x` -> `analyzer.x`; `onnxlens` stays `onnxlens`."""
    return parts[1:] if len(parts) > 1 and parts[0] == "onnxlens" else parts


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_lower_layers(package: str) -> None:
    violations = []
    for path in _sources(package):
        for target, line in _imports(path, package):
            top = target.split(".")[0]
            if top != package and top in ALLOWED and not _allowed(target, ALLOWED[package]):
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not violations, "\n".join(violations)


def _allowed(target: str, allowed: set[str]) -> bool:
    return any(target == a or target.startswith(a + ".") for a in allowed)


def test_analyzer_modules_follow_their_order() -> None:
    violations = []
    for path in _sources("analyzer"):
        rel = path.relative_to(ROOT / "analyzer").with_suffix("").parts
        if rel == ("__init__",):
            continue
        rank = ANALYZER_RANK.get(rel[0])
        if rank is None:
            violations.append(f"{path.relative_to(ROOT)} has no rank: give it a line in "
                              "ARCHITECTURE.md and ANALYZER_RANK")
            continue
        for target, line in _imports(path, "analyzer"):
            parts = target.split(".")
            if parts[0] == "analyzer" and len(parts) > 1:
                other = ANALYZER_RANK.get(parts[1])
                if other is not None and other > rank:
                    violations.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not violations, "\n".join(violations)


def test_architecture_md_says_the_same() -> None:
    """The analyzer's numbered list and the exporters' row of ARCHITECTURE.md are the tables
    above."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text[text.index("Inside `analyzer/`"):text.index("`reports`, `exporters`")]
    listed = {}
    for rank, names in re.findall(r"^(\d+)\. ((?:`\w+`(?:, )?)+) —", section, re.MULTILINE):
        listed.update(dict.fromkeys(re.findall(r"`(\w+)`", names), int(rank)))
    assert listed == ANALYZER_RANK
    row = next(line for line in text.splitlines() if line.startswith("| 3 | `onnxlens.exporters`"))
    allowed = {f"analyzer.{m}" for m in re.findall(r"`(\w+)`", row.split("|")[4])}
    assert allowed == ALLOWED["exporters"]


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The import reader must find a lazy upward import, or the tests above prove nothing."""
    pkg = tmp_path / "analyzer"
    pkg.mkdir()
    bad = pkg / "loader.py"
    bad.write_text("def f():\n    from ..reports.terminal import render\n", encoding="utf-8")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert _imports(bad, "analyzer") == [("reports.terminal", 2)]
    finally:
        ROOT = saved


def test_analyzing_an_onnx_file_does_not_import_torch() -> None:
    code = ("import sys, onnxlens.cli, onnxlens.analyzer.analysis, onnxlens.reports.terminal;"
            "print('torch' in sys.modules, 'onnxruntime' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# Issue 16's size bounds: the general estimator stays a roofline (runtimes' kernels live in
# analyzer/runtimes/ and backends/), and no function of the analyzer or backends grows past one
# screen. Both regressed once unseen (325 lines; an 85-line `_ort_kernel`).
ESTIMATOR_MAX_LINES, FUNCTION_MAX_LINES = 300, 80


def _long_functions(path: Path, limit: int, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.relative_to(root)}:{node.lineno} {node.name} "
            f"({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > limit]


def test_the_estimator_and_functions_stay_small() -> None:
    estimator = ROOT / "analyzer" / "estimate.py"
    assert len(estimator.read_text(encoding="utf-8").splitlines()) <= ESTIMATOR_MAX_LINES
    long = [f for package in ("analyzer", "backends") for path in (ROOT / package).rglob("*.py")
            for f in _long_functions(path, FUNCTION_MAX_LINES)]
    assert not long, f"functions over {FUNCTION_MAX_LINES} lines: {long}"


def test_the_size_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_MAX_LINES))
    (tmp_path / "m.py").write_text(f"def f():\n{body}")
    assert _long_functions(tmp_path / "m.py", FUNCTION_MAX_LINES, tmp_path) == [
        "m.py:1 f (81 lines)"]
