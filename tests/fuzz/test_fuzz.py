"""The bounded fuzz run of the test suite (under a minute): every generated input ends in a
result or an `OnnxLensError`, within 20 s and without a memory blow-up (`fuzz_targets`); a
mutated plan of the native executor is refused or runs (tests/sanitize.sh runs it under
AddressSanitizer).

The examples are derandomized, so a run is repeatable; `ONNXLENS_FUZZ_EXAMPLES=N` changes how
many each target gets. The long, random run is `python benchmarks/fuzz.py --seconds 600`.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import fuzz_targets as targets
import onnx
import pytest
from hypothesis import HealthCheck, given, settings

EXAMPLES = int(os.environ.get("ONNXLENS_FUZZ_EXAMPLES", "500"))
if os.environ.get("ONNXLENS_FUZZ_LAST"):  # each input there before it runs (tests/sanitize.sh)
    _last = Path(os.environ["ONNXLENS_FUZZ_LAST"])
    targets.on_input = lambda name, data: _last.write_bytes(name.encode() + b"\n" + data)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(autouse=True)
def hang_watchdog() -> Iterator[None]:
    """A C++ loop would never give control back to a Python timeout: past the limit (for one
    whole test, generously), a watchdog thread dumps every stack and ends the process."""
    faulthandler.dump_traceback_later(targets.HANG_SECONDS * EXAMPLES, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def test_seeds_are_valid_models() -> None:
    for data in targets.SEEDS:
        assert targets.loader(data)


@FUZZ
@given(targets.mutated_model_bytes())
def test_loader_on_mutated_bytes(data: bytes) -> None:
    targets.loader(data)


@FUZZ
@given(targets.op_graphs(max_nodes=1))
def test_validation_on_one_op_graphs(model: onnx.ModelProto) -> None:
    targets.validation(model)


@FUZZ
@given(targets.op_graphs(max_nodes=6))
def test_analyzer_on_op_chains(model: onnx.ModelProto) -> None:
    targets.analyzer(model)


@FUZZ
@given(targets.mutated_input_files())
def test_input_files(tmp_path_factory: pytest.TempPathFactory, file: tuple[str, bytes]) -> None:
    folder: Path = tmp_path_factory.mktemp("inputs", numbered=True)
    targets.inputs(*file, folder)


@pytest.mark.skipif(importlib.util.find_spec("onnxlens.backends._native") is None,
                    reason="the native extension is not built")
def test_plan_seeds_are_valid_plans() -> None:
    assert len(targets.plan_seeds()) == len(targets._plan_seed_models())
    for args in targets.plan_seeds():
        assert targets.native_plan(args, 1, "", [])


@pytest.mark.skipif(importlib.util.find_spec("onnxlens.backends._native") is None,
                    reason="the native extension is not built")
@FUZZ
@given(targets.mutated_plans())
def test_native_plans(plan: tuple) -> None:
    targets.native_plan(*plan)


def test_complexity_oracle_judges_cost_per_byte() -> None:
    """benchmarks/fuzz.py's oracle: slow for the size, or memory-hungry for the size."""
    spec = importlib.util.spec_from_file_location(
        "onnxlens_fuzz_runner", Path(__file__).parents[2] / "benchmarks" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner  # (dataclasses look their module up)
    spec.loader.exec_module(runner)
    Oracle, seconds_per_kb = runner.Oracle, runner.seconds_per_kb

    oracle = Oracle(slow_seconds=2.0, seconds_per_kb=1.0, memory_per_byte=4096)
    assert seconds_per_kb(100, 0.5) == seconds_per_kb(1024, 0.5) == 0.5  # 1 KiB at least
    assert oracle.verdict(2048, 3.0, 0) == ("took 3.00 s for 2,048 bytes (1.50 s per KiB, over "
                                            "1.0 s per KiB)")
    assert oracle.verdict(2048, 1.9, 0) is None  # under slow_seconds
    assert oracle.verdict(8192, 6.0, 0) is None  # 0.75 s per KiB
    assert oracle.verdict(2048, 0.1, 300 << 20) == ("peak memory grew 300 MiB for 2,048 bytes "
                                                    "(153,600 bytes per byte, over 4,096)")
    assert oracle.verdict(2048, 0.1, 200 << 20) is None  # under 256 MiB
    assert oracle.verdict(1 << 20, 0.1, 1 << 30) is None  # 1,024 bytes per byte
