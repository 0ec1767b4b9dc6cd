"""The ONNX backend node tests (shipped with the onnx package) run against the native executor:
on the CPU (native-cpu), and through its CUDA kernels on the CPU emulator (native-cuda-emu: the
real executor code, `NativeCudaBackend` with `_native_cuda_emu` as the device).

Every node test whose model uses only ops native-cpu claims is run (native-cuda plans the same
way). The expected outcome of each is checked in, one file per backend (`EXPECTED`): `pass`,
or the reason it is excluded. A test that starts to pass, or an expected pass that fails, fails
here; regenerate the files with `python tests/test_native_node.py [BACKEND ...]` after a
change, and read the diff.
"""

from __future__ import annotations

import sys
import warnings
from functools import cache
from pathlib import Path

import numpy as np
import pytest

EXPECTED = {"native-cpu": Path(__file__).with_name("native_node_tests_expected.txt"),
            "native-cuda-emu": Path(__file__).with_name("native_cuda_emu_node_tests_expected.txt")}


@cache
def _cases() -> dict[str, object]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in load_model_tests(kind="node")}


def claimed_ops() -> frozenset[str]:
    from onnxlens.backends.native_cpu import supported_ops

    return frozenset(supported_ops())


def claimed_cases() -> list[str]:
    ops = claimed_ops()
    return sorted(name for name, case in _cases().items()
                  if all(n.op_type in ops and n.domain in ("", "ai.onnx")
                         for n in case.model.graph.node))


def make_backend(kind: str) -> object:
    from onnxlens.backends.native_cpu import NativeCpuBackend

    if kind == "native-cpu":
        return NativeCpuBackend(1)
    from onnxlens.backends import _native_cuda_emu
    from onnxlens.backends.native_cuda import NativeCudaBackend

    return NativeCudaBackend(module=_native_cuda_emu)


def run_case(name: str, kind: str = "native-cpu") -> str:
    """'pass', or why the case does not pass on backend `kind` (one line)."""
    from onnxlens.analyzer.errors import OnnxLensError

    case = _cases()[name]
    backend = make_backend(kind)
    try:
        backend.prepare(case.model)
        weights = {t.name for t in case.model.graph.initializer}
        names = [i.name for i in case.model.graph.input if i.name not in weights]
        for inputs, expected in case.data_sets:
            got = backend.run(dict(zip(names, map(_array, inputs), strict=True)))
            for out, want in zip(case.model.graph.output, map(_array, expected), strict=True):
                value = got[out.name]
                if value.dtype != np.asarray(want).dtype:
                    return f"dtype {value.dtype} instead of {np.asarray(want).dtype}"
                np.testing.assert_allclose(value, want, rtol=case.rtol, atol=case.atol)
    except OnnxLensError as e:
        return "unsupported: " + str(e).splitlines()[0][:160]
    except AssertionError:
        return "wrong values"
    except (TypeError, ValueError) as e:  # sequence or optional values: not tensors
        return f"not a tensor test: {str(e).splitlines()[0][:100]}"
    return "pass"


def _array(value: object) -> np.ndarray:
    import onnx

    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, np.generic):  # a 0-d input (CumSum's axis, Pad's value) as a scalar
        return np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{type(value).__name__} input")
    return value


def _expected(kind: str) -> dict[str, str]:
    lines = EXPECTED[kind].read_text(encoding="utf-8").splitlines()
    return dict(line.split(" ", 1) for line in lines if line and not line.startswith("#"))


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "native-cuda-emu":
        pytest.importorskip("onnxlens.backends._native_cuda_emu")
    return request.param


@pytest.fixture(scope="module")
def expected(kind: str) -> dict[str, str]:
    return _expected(kind)


def test_every_claimed_case_is_listed(expected: dict[str, str]) -> None:
    assert sorted(expected) == claimed_cases()


def test_expected_passes_pass(kind: str, expected: dict[str, str]) -> None:
    failures = {n: why for n in expected if expected[n] == "pass"
                for why in [run_case(n, kind)] if why != "pass"}
    assert not failures, failures


def test_exclusions_still_fail(kind: str, expected: dict[str, str]) -> None:
    """An exclusion that now passes must move to the pass list (it is a claim we can make)."""
    fixed = [n for n, why in expected.items() if why != "pass" and run_case(n, kind) == "pass"]
    assert not fixed, fixed


def test_every_exclusion_has_a_reason(expected: dict[str, str]) -> None:
    assert all(why.strip() for why in expected.values())


def write_expected(kind: str) -> str:
    results = {name: run_case(name, kind) for name in claimed_cases()}
    passed = sum(r == "pass" for r in results.values())
    header = [f"# ONNX backend node tests for the ops native-cpu claims, on {kind}: {passed} of "
              f"{len(results)} pass.", "# name, then `pass` or why the case is excluded."]
    EXPECTED[kind].write_text("\n".join([*header, *(f"{n} {r}" for n, r in results.items())])
                              + "\n", encoding="utf-8")
    return f"{kind}: {passed} of {len(results)} pass"


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(EXPECTED):
        print(write_expected(name), file=sys.stderr)
