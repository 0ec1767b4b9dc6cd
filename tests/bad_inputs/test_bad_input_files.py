"""Bad input files for `onnxlens compare --inputs` (.npy / .npz / .pb): each a `UsageError`
naming the file, the input and what differs from the model, never a traceback; a .pb tensor's
external data is never followed."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_bad_inputs import recording_opens  # the audit hook on "open"

from onnxlens.analyzer.errors import UsageError
from onnxlens.backends.base import InputSpec, input_specs, load_inputs

vi = helper.make_tensor_value_info


def two_input_model() -> onnx.ModelProto:
    """a[batch, 8] float32, ids[batch, 3] int64 -> ..."""
    nodes = [helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["f"], ["s"], keepdims=1),
             helper.make_node("Add", ["a", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("a", TensorProto.FLOAT, ["batch", 8]),
                                           vi("ids", TensorProto.INT64, ["batch", 3])],
                              [vi("y", TensorProto.FLOAT, ["batch", 8])])
    return helper.make_model(graph)


def one_input_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [vi("x", TensorProto.FLOAT, [2, 8])],
                              [vi("y", TensorProto.FLOAT, [2, 8])])
    return helper.make_model(graph)


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def _npz(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def _pb(tensor: TensorProto) -> bytes:
    return tensor.SerializeToString()


def _external_pb(location: str) -> bytes:
    tensor = numpy_helper.from_array(np.ones((2, 8), np.float32), "x")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    return _pb(tensor)


def _bad_header() -> bytes:
    data = bytearray(_npy(np.ones((2, 8), np.float32)))
    data[20:30] = b"(999999999"
    return bytes(data)


def _strings() -> bytes:
    tensor = TensorProto(name="x", data_type=TensorProto.STRING, dims=[2])
    tensor.string_data.extend([b"a", b"b"])
    return _pb(tensor)


@dataclass
class FileCase:
    id: str
    file: str
    data: Callable[[Path], bytes]  # given the folder outside, where the sentinel lies
    fragment: str
    two_inputs: bool = True


F32, I64 = np.float32, np.int64
CASES = [
    FileCase("float data for an int64 input", "x.npz",
             lambda _: _npz(a=np.ones((2, 8), F32), ids=np.ones((2, 3), F32)),
             "input 'ids' is float32, but the model takes int64"),
    FileCase("complex data for a float input", "x.npz",
             lambda _: _npz(a=np.ones((2, 8), np.complex64), ids=np.ones((2, 3), I64)),
             "input 'a' is complex64, but the model takes float32"),
    FileCase("strings for a float input", "x.npy", lambda _: _npy(np.array(["a", "b"])),
             "input 'x' is <U1, but the model takes float32", two_inputs=False),
    FileCase("wrong rank", "x.npy", lambda _: _npy(np.ones((16,), F32)),
             "input 'x' has shape [16] (rank 1), but the model takes rank 2: [2, 8]",
             two_inputs=False),
    FileCase("wrong fixed dim", "x.npy", lambda _: _npy(np.ones((2, 9), F32)),
             "input 'x' has shape [2, 9], but the model takes [2, 8] (dim 1 differs)",
             two_inputs=False),
    FileCase("symbolic dim that disagrees between inputs", "x.npz",
             lambda _: _npz(a=np.ones((2, 8), F32), ids=np.ones((3, 3), I64)),
             "input 'ids': dim 'batch' is 3, but 2 in input 'a'"),
    FileCase("fixed dim of the wrong size under a symbolic one", "x.npz",
             lambda _: _npz(a=np.ones((4, 7), F32), ids=np.ones((4, 3), I64)),
             "input 'a' has shape [4, 7], but the model takes [batch, 8] (dim 1 differs)"),
    FileCase(".pb with external data outside", "x.pb",
             lambda outside: _external_pb(str(outside / "secret.bin")),
             "the tensor's data is in another file (external data); only self-contained .pb "
             "inputs are read", two_inputs=False),
    FileCase(".pb with external data beside it", "x.pb", lambda _: _external_pb("secret.bin"),
             "the tensor's data is in another file", two_inputs=False),
    FileCase(".pb of strings", "x.pb", lambda _: _strings(), "unsupported tensor data type 8",
             two_inputs=False),
    FileCase(".pb that is not a tensor", "x.pb", lambda _: b"\xff\xff\xff",
             "cannot read inputs (Error parsing message", two_inputs=False),
    FileCase(".pb whose dims hold no data", "x.pb",
             lambda _: _pb(TensorProto(name="x", data_type=TensorProto.FLOAT, dims=[2**40])),
             "cannot read inputs", two_inputs=False),
    FileCase("empty .npy", "x.npy", lambda _: b"", "cannot read inputs (No data left in file)",
             two_inputs=False),
    FileCase("truncated .npz", "x.npz",
             lambda _: _npz(a=np.ones((2, 8), F32), ids=np.ones((2, 3), I64))[:200],
             "cannot read inputs (File is not a zip file)"),
    FileCase("malformed .npy header", "x.npy", lambda _: _bad_header(), "cannot read inputs",
             two_inputs=False),
    FileCase("pickled object array", "x.npy",
             lambda _: _npy(np.array([{"a": 1}, None], dtype=object)),
             "cannot read inputs (Object arrays cannot be loaded when allow_pickle=False)",
             two_inputs=False),
    FileCase("unknown suffix", "x.txt", lambda _: b"1 2 3", "expected an .npy, .npz or .pb file",
             two_inputs=False),
]


def _specs(two_inputs: bool) -> list[InputSpec]:
    return input_specs(two_input_model() if two_inputs else one_input_model())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_file(case: FileCase, tmp_path: Path) -> None:
    outside, inside = tmp_path / "outside", tmp_path / "inputs"
    outside.mkdir()
    inside.mkdir()
    (outside / "secret.bin").write_bytes(np.ones((2, 8), np.float32).tobytes())
    (inside / "secret.bin").symlink_to(outside / "secret.bin")
    path = inside / case.file
    path.write_bytes(case.data(outside))
    with recording_opens() as opened, pytest.raises(UsageError) as caught:
        load_inputs([path], _specs(case.two_inputs))
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and case.fragment in message
    assert "\n" not in message
    assert not any(Path(p).name == "secret.bin" for p in opened), opened


def test_good_files_still_load_and_convert_within_a_kind(tmp_path: Path) -> None:
    path = tmp_path / "ok.npz"
    path.write_bytes(_npz(a=np.ones((5, 8), np.float64), ids=np.ones((5, 3), np.int32)))
    (sample,) = load_inputs([path], _specs(True))
    assert sample["a"].dtype == np.float32 and sample["ids"].dtype == np.int64
    assert sample["a"].shape == (5, 8)


def test_compare_command_reports_a_bad_input_file_in_one_line(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes(one_input_model().SerializeToString())
    bad = tmp_path / "x.npy"
    bad.write_bytes(_npy(np.ones((2, 9), np.float32)))
    code = "from onnxlens.cli import main; main()"
    out = subprocess.run([sys.executable, "-c", code, "compare", str(model), "--inputs", str(bad),
                          "--runs", "1", "--warmup", "0"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "(dim 1 differs)" in errors[0], out.stderr
