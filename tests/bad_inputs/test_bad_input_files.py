"""Bad input files for `onnxlens compare --inputs` (.npy / .npz / .pb): each a `UsageError`
naming the file (and the .npz member), the input and what differs from the model, never a
traceback; a .pb tensor's external data is never followed; .npy headers and the sizes an .npz
declares are checked before anything is decompressed or allocated."""

from __future__ import annotations

import io
import subprocess
import sys
import tracemalloc
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_bad_inputs import recording_opens  # the audit hook on "open"

from onnxlens.analyzer.errors import UsageError
from onnxlens.analyzer.validate import Limits
from onnxlens.backends.base import MAX_NPZ_MEMBERS, InputSpec, input_specs, load_inputs

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


def one_input_model(batch: int | str = 2) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [vi("x", TensorProto.FLOAT, [batch, 8])],
                              [vi("y", TensorProto.FLOAT, [batch, 8])])
    return helper.make_model(graph)


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def _npz(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def _header(shape: tuple[int, ...], descr: str = "<f4", version: int = 1) -> bytes:
    """An .npy header alone (no data follows): any shape, even one numpy would not write."""
    out = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    if version == 1:
        np.lib.format.write_array_header_1_0(out, header)
    else:
        np.lib.format.write_array_header_2_0(out, header)
    data = bytearray(out.getvalue())
    data[6] = version  # 3.0 has 2.0's layout
    return bytes(data)


def _zip(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED) -> bytes:
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name
        with zipfile.ZipFile(out, "w", compression=method) as archive:
            for name, data in members:
                archive.writestr(name, data)
    return out.getvalue()


def _ids() -> tuple[str, bytes]:
    return ("ids.npy", _npy(np.ones((2, 3), np.int64)))


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
    limit: int | None = None  # max_tensor_bytes, when not the default
    model: str = ""  # "symbolic": one input x[batch, 8]


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
    FileCase("empty .npy", "x.npy", lambda _: b"",
             "cannot read inputs (EOF: reading magic string, expected 8 bytes got 0)",
             two_inputs=False),
    FileCase("truncated .npz", "x.npz",
             lambda _: _npz(a=np.ones((2, 8), F32), ids=np.ones((2, 3), I64))[:200],
             "cannot read inputs (File is not a zip file)"),
    FileCase("malformed .npy header", "x.npy", lambda _: _bad_header(), "cannot read inputs",
             two_inputs=False),
    FileCase("pickled object array", "x.npy",
             lambda _: _npy(np.array([{"a": 1}, None], dtype=object)),
             "x.npy: an object array (dtype object: a pickle); only plain arrays are read",
             two_inputs=False),
    # Sizes: every check below runs on the .npy header or the zip directory, before any data.
    FileCase(".npz bomb: a deflated member declaring more than the budget", "x.npz",
             lambda _: _zip([("a.npy", _npy(np.zeros((2**17, 8), F32))), _ids()],
                            zipfile.ZIP_DEFLATED),
             "member 'a.npy' declares 4194432 bytes uncompressed, over the limit of 1000000 "
             "bytes (max_tensor_bytes)", limit=10**6),
    FileCase(".npz member whose header asks for more than the budget", "x.npz",
             lambda _: _zip([("a.npy", _header((2**36, 8))),
                             ("ids.npy", _header((2**36, 3), "<i8"))]),
             "member 'a.npy': the .npy header asks for [68719476736, 8] float32 "
             "(2199023255552 bytes), over the limit of 274877906944 bytes (max_tensor_bytes)"),
    FileCase(".npz member whose header asks for more data than it declares", "x.npz",
             lambda _: _zip([("a.npy", _header((2, 8)) + b"\0" * 10), _ids()]),
             "member 'a.npy': the .npy header asks for 64 bytes of data, but only 10 follow it"),
    FileCase(".npz inputs over the budget together", "x.npz",
             lambda _: _zip([("a.npy", _header((2**14, 8))), ("ids.npy", _header((2**14, 3),
                                                                                "<i8"))]),
             "the inputs take 917504 bytes together, over the limit of 600000 bytes",
             limit=600_000),
    FileCase(".npz member converted past the budget (bool to float32)", "x.npz",
             lambda _: _zip([("a.npy", _header((2**15, 8), "|b1")),
                             ("ids.npy", _header((2**15, 3), "<i8"))]),
             "the .npy header asks for [32768, 8] bool (1048576 bytes), over the limit of "
             "1000000 bytes", limit=10**6),
    FileCase(".npz with thousands of members", "x.npz",
             lambda _: _zip([(f"m{i}.npy", b"") for i in range(MAX_NPZ_MEMBERS + 1000)]),
             f"{MAX_NPZ_MEMBERS + 1000} members; an input file holds at most "
             f"{MAX_NPZ_MEMBERS} arrays"),
    FileCase(".npz with a huge zip directory", "x.npz",
             lambda _: _zip([(f"{i:04}" + "m" * 5000, b"") for i in range(900)]),
             "its zip directory takes 4545000 bytes; at most 4194304 are read"),
    FileCase(".npz member compressed with bzip2", "x.npz",
             lambda _: _zip([("a.npy", _npy(np.ones((2, 8), F32))), _ids()], zipfile.ZIP_BZIP2),
             "member 'a.npy' uses zip compression method 12; only stored and deflated members "
             "are read"),
    FileCase(".npz member twice", "x.npz",
             lambda _: _zip([("a.npy", _npy(np.ones((2, 8), F32))), _ids(),
                             ("a.npy", _npy(np.ones((2, 8), F32)))]),
             "member 'a.npy' appears twice"),
    FileCase(".npz member named twice, with and without .npy", "x.npz",
             lambda _: _zip([("a.npy", _npy(np.ones((2, 8), F32))), _ids(),
                             ("a", _npy(np.ones((2, 8), F32)))]),
             "member 'a' appears twice"),
    FileCase(".npz member that is not an .npy", "x.npz",
             lambda _: _zip([("a.npy", b"not an array"), _ids()]),
             "member 'a.npy': cannot read inputs (the magic string is not correct"),
    FileCase(".npz member with a pickled object array", "x.npz",
             lambda _: _npz(a=np.array([[{"a": 1}] * 8] * 2, dtype=object),
                            ids=np.ones((2, 3), I64)),
             "member 'a.npy': an object array (dtype object: a pickle); only plain arrays are "
             "read"),
    FileCase(".npz with an input missing", "x.npz", lambda _: _zip([_ids()]),
             "no array for input(s) a"),
    FileCase(".npy with an absurd header shape", "x.npy",
             lambda _: _header((2**62, 8)),
             "x.npy: the .npy header asks for [4611686018427387904, 8] float32 "
             "(147573952589676412928 bytes), over the limit of 274877906944 bytes",
             model="symbolic"),
    FileCase(".npy header of the wrong fixed shape", "x.npy",
             lambda _: _header((2**40, 8)),
             "input 'x' has shape [1099511627776, 8], but the model takes [2, 8] (dim 0 "
             "differs)", two_inputs=False),
    FileCase(".npy header with a negative dim", "x.npy", lambda _: _header((-2, 8)),
             "x.npy: the .npy header's shape [-2, 8] has a negative dim", model="symbolic"),
    FileCase(".npy header asking for more data than the file holds", "x.npy",
             lambda _: _header((2**20, 8)) + b"\0" * 16,
             "x.npy: the .npy header asks for 33554432 bytes of data, but only 16 follow it",
             model="symbolic"),
    FileCase(".npy of format version 3.0", "x.npy",
             lambda _: _header((2, 8), version=3) + b"\0" * 64,
             "x.npy: .npy format version 3.0 is not read (1.0 and 2.0 are)", two_inputs=False),
    FileCase("unknown suffix", "x.txt", lambda _: b"1 2 3", "expected an .npy, .npz or .pb file",
             two_inputs=False),
]


def _specs(two_inputs: bool, model: str = "") -> list[InputSpec]:
    if model == "symbolic":
        return input_specs(one_input_model("batch"))
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
    limits = Limits(max_tensor_bytes=case.limit) if case.limit else Limits()
    tracemalloc.start()
    try:
        with recording_opens() as opened, pytest.raises(UsageError) as caught:
            load_inputs([path], _specs(case.two_inputs, case.model), limits=limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert type(caught.value) is UsageError
    assert message.startswith(f"{path}: ") and case.fragment in message, message
    assert "\n" not in message
    assert peak < 2**20 + path.stat().st_size, peak  # no array was allocated
    assert not any(Path(p).name == "secret.bin" for p in opened), opened


def test_good_files_still_load_and_convert_within_a_kind(tmp_path: Path) -> None:
    path = tmp_path / "ok.npz"
    path.write_bytes(_npz(a=np.ones((5, 8), np.float64), ids=np.ones((5, 3), np.int32)))
    (sample,) = load_inputs([path], _specs(True))
    assert sample["a"].dtype == np.float32 and sample["ids"].dtype == np.int64
    assert sample["a"].shape == (5, 8)


def test_npz_members_other_than_the_inputs_are_never_read(tmp_path: Path) -> None:
    """Extra arrays (expected outputs, say) are allowed; only the inputs' members are opened."""
    path = tmp_path / "ok.npz"
    path.write_bytes(_zip([("a.npy", _npy(np.ones((2, 8), F32))), _ids(),
                           ("junk.npy", _header((2**40, 2**40))), ("notes.txt", b"hello")],
                          zipfile.ZIP_DEFLATED))
    (sample,) = load_inputs([path], _specs(True))
    assert sample["a"].shape == (2, 8) and sample["ids"].dtype == np.int64


def test_fortran_order_and_big_endian_npy_still_load(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    want = np.asfortranarray(np.arange(16, dtype=">f4").reshape(2, 8))
    path.write_bytes(_npy(want))
    (sample,) = load_inputs([path], _specs(False))
    np.testing.assert_array_equal(sample["x"], want)


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


def test_compare_command_takes_the_input_files_byte_budget(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes(one_input_model("batch").SerializeToString())
    big = tmp_path / "x.npy"
    big.write_bytes(_npy(np.ones((5, 8), np.float32)))  # 160 bytes: fits the model's [batch, 8]
    code = "from onnxlens.cli import main; main()"
    out = subprocess.run([sys.executable, "-c", code, "compare", str(model), "--inputs", str(big),
                          "--max-tensor-bytes", "100", "--runs", "1", "--warmup", "0"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.stderr
    assert "(160 bytes), over the limit of 100 bytes (max_tensor_bytes)" in errors[0]
