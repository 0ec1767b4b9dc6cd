"""Bad input, each generated here: one clear error line, a non-zero exit, no traceback.

Every case runs twice: through the Python API (`onnxlens.analyze` raises exactly the expected
`OnnxLensError` subclass, with a message naming the file, node, tensor or field) and through
the `analyze` command (non-zero exit, stderr exactly one line starting with "error:").
External-data cases also prove, with an audit hook on "open", that nothing outside the model's
folder was opened: each has a sentinel file in a sibling folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxlens
from onnxlens.analyzer.errors import (
    ExternalDataError,
    InvalidModelError,
    ModelLoadError,
    OnnxLensError,
    ShapeError,
    UsageError,
)

vi = helper.make_tensor_value_info


# ---- tiny models ------------------------------------------------------------------------------


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto] | None = None,
           opsets: tuple[tuple[str, int], ...] = (("", 17),)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bad", inputs, outputs, inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _weights(shape: tuple[int, ...] = (4, 3, 3, 3), name: str = "w") -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def conv_model(w: onnx.TensorProto | None = None, x_shape: list[Any] | None = None
               ) -> onnx.ModelProto:
    """x[1,3,8,8] -> Conv(w[4,3,3,3]) -> Relu -> y[1,4,6,6]."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, [vi("x", TensorProto.FLOAT, x_shape or [1, 3, 8, 8])],
                  [vi("y", TensorProto.FLOAT, [None] * 4)], [w or _weights()])


def chain(*links: tuple[str, list[str], str, str]) -> onnx.ModelProto:
    """Nodes given as (op_type, inputs, output, name), from x[2,3] to y[2,3]."""
    nodes = [helper.make_node(op, ins, [out], name=name) for op, ins, out, name in links]
    return _model(nodes, [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])])


def external(model: onnx.ModelProto, **entries: str | int) -> onnx.ModelProto:
    """`model` with initializer w's data moved out to the file and place `entries` say."""
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in entries.items():
        w.external_data.add(key=key, value=str(value))
    return model


W_BYTES = 4 * 3 * 3 * 3 * 4  # conv_model's w: 108 float32


# ---- cases ------------------------------------------------------------------------------------


@dataclass
class Call:
    """What one case feeds to `onnxlens.analyze`, and to the CLI (None: not expressible)."""

    source: Any
    kwargs: dict[str, Any] = field(default_factory=dict)
    cli: list[str] | None = None


@dataclass
class Folders:
    """A model's folder and, beside it, a folder it must never read (holding the sentinel)."""

    model: Path
    outside: Path

    @property
    def sentinel(self) -> Path:
        return self.outside / "secret.bin"

    def save(self, model: onnx.ModelProto, name: str = "model.onnx", **kwargs: Any) -> Call:
        path = self.model / name
        path.write_bytes(model.SerializeToString())
        cli = [str(path)]
        for key, value in kwargs.items():
            if key == "batch":
                cli += ["--batch", str(value)]
            elif key == "input_shapes":
                cli += [f"--input-shape={n}={'x'.join(map(str, s))}" for n, s in value.items()]
        return Call(path, kwargs, cli)

    def write(self, data: bytes, name: str = "model.onnx") -> Call:
        path = self.model / name
        path.write_bytes(data)
        return Call(path, {}, [str(path)])


Build = Callable[[Folders], Call]


@dataclass
class Case:
    id: str
    build: Build
    error: type[OnnxLensError]
    fragment: str  # a piece of the message that names the problem


def _valid_bytes() -> bytes:
    return conv_model().SerializeToString()


def _truncated(f: Folders) -> Call:
    data = _valid_bytes()
    return f.write(data[: len(data) // 2])


def _missing(f: Folders) -> Call:
    path = f.model / "missing.onnx"
    return Call(path, {}, [str(path)])


def _directory(f: Folders) -> Call:
    path = f.model / "dir.onnx"
    path.mkdir()
    return Call(path, {}, [str(path)])


def _cycle(f: Folders) -> Call:
    # add reads t2, which relu makes from add's own output.
    nodes = [helper.make_node("Add", ["x", "t2"], ["t1"], name="add"),
             helper.make_node("Relu", ["t1"], ["t2"], name="relu"),
             helper.make_node("Identity", ["t2"], ["y"], name="out")]
    return f.save(_model(nodes, [vi("x", TensorProto.FLOAT, [2])],
                         [vi("y", TensorProto.FLOAT, [2])]))


def _unsorted(f: Folders) -> Call:
    return f.save(chain(("Relu", ["t"], "y", "second"), ("Relu", ["x"], "t", "first")))


def _self_loop(f: Folders) -> Call:
    return f.save(chain(("Add", ["x", "y"], "y", "loop")))


def _dangling(f: Folders) -> Call:
    return f.save(chain(("Add", ["x", "ghost"], "y", "reader")))


def _produced_twice(f: Folders) -> Call:
    return f.save(chain(("Relu", ["x"], "t", "one"), ("Neg", ["x"], "t", "two"),
                        ("Identity", ["t"], "y", "out")))


def _shadows_input(f: Folders) -> Call:
    return f.save(chain(("Relu", ["x"], "x", "shadow"), ("Identity", ["x"], "y", "out")))


def _output_unproduced(f: Folders) -> Call:
    return f.save(chain(("Relu", ["x"], "t", "r")))


def _initializer_twice(f: Folders) -> Call:
    model = conv_model()
    model.graph.initializer.append(_weights())
    return f.save(model)


def _unknown_op(f: Folders) -> Call:
    return f.save(chain(("NoSuchOp", ["x"], "y", "mystery")))


def _bad_attribute(f: Folders) -> Call:
    model = chain(("Relu", ["x"], "y", "r"))
    model.graph.node[0].attribute.append(helper.make_attribute("alpha_typo", 1.0))
    return f.save(model)


def _output_without_shape(f: Folders) -> Call:
    model = conv_model()
    model.graph.output[0].type.tensor_type.ClearField("shape")
    return f.save(model)


def _unknown_dtype(f: Folders) -> Call:
    model = conv_model()
    model.graph.initializer[0].data_type = 99
    return f.save(model)


def _short_raw_data(big: bool) -> Build:
    # The small w is checked by onnx's checker, the big one (left out of the light copy that
    # onnx checks) by us.
    def build(f: Folders) -> Call:
        w = _weights((512, 3, 3, 3) if big else (4, 3, 3, 3))
        w.raw_data = w.raw_data[:-4]
        model = conv_model(w)
        if big:
            model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 512
        return f.save(model)

    return build


def _huge_input(f: Folders) -> Call:
    return f.save(conv_model(x_shape=[2**40, 3, 8, 8]))


def _huge_initializer(f: Folders) -> Call:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2**40, 3, 3, 3])
    return f.save(conv_model(w))


def _huge_inferred(f: Folders) -> Call:
    shape = numpy_helper.from_array(np.array([2**20, 2**20], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill"),
             helper.make_node("ReduceSum", ["big"], ["y"], name="sum", keepdims=0)]
    return f.save(_model(nodes, [], [vi("y", TensorProto.FLOAT, [])], [shape]))


def _negative_input_dim(f: Folders) -> Call:
    return f.save(conv_model(x_shape=[1, -3, 8, 8]))


def _negative_initializer_dim(f: Folders) -> Call:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, -3, 3, 3])
    return f.save(conv_model(w))


def _matmul_conflict(f: Folders) -> Call:
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")]
    return f.save(_model(nodes, [vi("a", TensorProto.FLOAT, [2, 3]),
                                 vi("b", TensorProto.FLOAT, [4, 5])],
                         [vi("y", TensorProto.FLOAT, [None, None])]))


def _pinned(**kwargs: Any) -> Build:
    return lambda f: f.save(conv_model(x_shape=["batch", 3, 8, 8]), **kwargs)


def _ext(entries: dict[str, str | int], setup: Callable[[Folders], None] | None = None
         ) -> Build:
    def build(f: Folders) -> Call:
        if setup is not None:
            setup(f)
        if not (f.model / "weights.bin").exists() and "location" in entries:
            (f.model / "weights.bin").write_bytes(_weights().raw_data)
        return f.save(external(conv_model(), **entries))

    return build


def _symlink_file(f: Folders) -> None:
    (f.model / "weights.bin").symlink_to(f.sentinel)


def _symlink_dir(f: Folders) -> None:
    (f.model / "sub").symlink_to(f.outside, target_is_directory=True)


def _hard_link(f: Folders) -> None:
    os.link(f.sentinel, f.model / "weights.bin")


def _fifo(f: Folders) -> None:
    os.mkfifo(f.model / "weights.bin")


def _bytes_with_external(f: Folders) -> Call:
    (f.model / "weights.bin").write_bytes(_weights().raw_data)
    return Call(external(conv_model(), location="weights.bin").SerializeToString())


def _proto_with_external(f: Folders) -> Call:
    (f.model / "weights.bin").write_bytes(_weights().raw_data)
    return Call(external(conv_model(), location="weights.bin"))


CASES = [
    # Files that are not ONNX models.
    Case("missing file", _missing, ModelLoadError, "missing.onnx: no such file"),
    Case("directory", _directory, ModelLoadError, "dir.onnx: a directory"),
    Case("empty file", lambda f: f.write(b""), ModelLoadError, "model.onnx: empty"),
    Case("truncated model", _truncated, ModelLoadError, "model.onnx: not an ONNX model, or "
         "truncated"),
    Case("random bytes", lambda f: f.write(np.random.default_rng(0).bytes(4096)),
         ModelLoadError, "model.onnx: not an ONNX model"),
    Case("text file", lambda f: f.write(b"graph {\n  node: relu\n}\n"), ModelLoadError,
         "model.onnx: not an ONNX model"),
    Case("png header", lambda f: f.write(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(64)),
         ModelLoadError, "model.onnx: not an ONNX model"),
    Case("zip archive", lambda f: f.write(b"PK\x03\x04" + bytes(64)), ModelLoadError,
         "a zip archive"),
    Case("protobuf without graph", lambda f: f.write(b"\x08\x07"), ModelLoadError,
         "no ir_version or no graph"),
    # Graph structure.
    Case("cycle", _cycle, InvalidModelError, "graph has a cycle: nodes 'add' -> 'relu' -> 'add'"),
    Case("node reads its own output", _self_loop, InvalidModelError,
         "graph has a cycle: nodes 'loop' -> 'loop'"),
    Case("unsorted nodes", _unsorted, InvalidModelError,
         "not in topological order: node 'second' reads tensor 't' before node 'first'"),
    Case("dangling input", _dangling, InvalidModelError,
         "node 'reader' reads tensor 'ghost', which no node, graph input or initializer"),
    Case("tensor produced twice", _produced_twice, InvalidModelError,
         "tensor 't' is produced twice, by node 'one' and node 'two'"),
    Case("node output shadows a graph input", _shadows_input, InvalidModelError,
         "tensor 'x' is a graph input and is also produced by node 'shadow'"),
    Case("graph output produced by no node", _output_unproduced, InvalidModelError,
         "graph output 'y' is produced by no node"),
    Case("initializer defined twice", _initializer_twice, InvalidModelError,
         "initializer 'w' is defined twice"),
    Case("unknown op in the default domain", _unknown_op, InvalidModelError,
         "node 'mystery' (NoSuchOp): No Op registered for NoSuchOp"),
    Case("unknown attribute", _bad_attribute, InvalidModelError,
         "node 'r' (Relu): Unrecognized attribute: alpha_typo"),
    Case("graph output without a shape", _output_without_shape, InvalidModelError,
         "graph output 'y' has no shape"),
    Case("unknown data type", _unknown_dtype, InvalidModelError,
         "initializer 'w': unknown data type 99"),
    Case("raw data too short (small initializer)", _short_raw_data(big=False),
         InvalidModelError, "(tensor name: w) raw_data size (428 bytes) is too small"),
    Case("raw data too short (big initializer)", _short_raw_data(big=True), InvalidModelError,
         "initializer 'w': TensorProto (tensor name: w) raw_data size"),
    # Sizes and shapes.
    Case("input dim 2**40", _huge_input, ShapeError,
         "input 'x': shape 1099511627776x3x8x8 needs 844,424,930,131,968 bytes, over the"),
    Case("initializer dim 2**40", _huge_initializer, ShapeError,
         "initializer 'w': shape 1099511627776x3x3x3 needs"),
    Case("inferred tensor too big", _huge_inferred, ShapeError,
         "tensor 'big': shape 1048576x1048576 needs"),
    Case("negative input dim", _negative_input_dim, ShapeError,
         "input 'x': negative dimension -3"),
    Case("negative initializer dim", _negative_initializer_dim, ShapeError,
         "initializer 'w': negative dimension -3"),
    Case("MatMul shape conflict", _matmul_conflict, ShapeError,
         "node 'mm' (MatMul): Incompatible dimensions for matrix multiplication "
         "(inputs 'a' 2x3, 'b' 4x5)"),
    Case("--input-shape names no input", _pinned(input_shapes={"image": (1, 3, 8, 8)}),
         ShapeError, "--input-shape image: the model has no input 'image'; its inputs are 'x'"),
    Case("--input-shape of the wrong rank", _pinned(input_shapes={"x": (1, 3, 8)}), ShapeError,
         "--input-shape x: rank 3 given, but input 'x' has rank 4"),
    Case("--batch 0", _pinned(batch=0), UsageError, "--batch"),
    Case("--input-shape with a zero dim", _pinned(input_shapes={"x": (0, 3, 8, 8)}), UsageError,
         "--input-shape x: dims must be positive"),
    # External data.
    Case("external '..'", _ext({"location": "../outside/secret.bin"}), ExternalDataError,
         "tensor 'w': external data location '../outside/secret.bin' contains '..'"),
    Case("external 'sub/../../x'", _ext({"location": "sub/../../outside/secret.bin"}),
         ExternalDataError, "location 'sub/../../outside/secret.bin' contains '..'"),
    Case("external absolute path", lambda f: _ext({"location": str(f.sentinel)})(f),
         ExternalDataError, "secret.bin' is absolute"),
    Case("external symlink to a file outside", _ext({"location": "weights.bin"}, _symlink_file),
         ExternalDataError, "location 'weights.bin' leads out of the model's folder"),
    Case("external symlinked folder", _ext({"location": "sub/secret.bin"}, _symlink_dir),
         ExternalDataError, "location 'sub/secret.bin' leads out of the model's folder"),
    Case("external hard link", _ext({"location": "weights.bin"}, _hard_link), ExternalDataError,
         "file 'weights.bin' has other hard links"),
    Case("external FIFO", _ext({"location": "weights.bin"}, _fifo), ExternalDataError,
         "location 'weights.bin' is not a regular file"),
    Case("external negative offset", _ext({"location": "weights.bin", "offset": -4}),
         ExternalDataError, "tensor 'w': external data offset -4 is negative"),
    Case("external negative length", _ext({"location": "weights.bin", "length": -1}),
         ExternalDataError, "tensor 'w': external data length -1 is negative"),
    Case("external offset past the end", _ext({"location": "weights.bin", "offset": 10_000}),
         ExternalDataError, f"offset 10000 is past the end of 'weights.bin' ({W_BYTES} bytes)"),
    Case("external length past the end",
         _ext({"location": "weights.bin", "offset": 8, "length": W_BYTES}), ExternalDataError,
         f"offset 8 + length {W_BYTES} runs past the end of 'weights.bin'"),
    Case("external offset not a number", _ext({"location": "weights.bin", "offset": "1e3"}),
         ExternalDataError, "tensor 'w': external data offset '1e3' is not an integer"),
    Case("external unknown key", _ext({"location": "weights.bin", "url": "http://x"}),
         ExternalDataError, "tensor 'w': external data has unknown key 'url'"),
    Case("external no location", _ext({"offset": 0}), ExternalDataError,
         "tensor 'w': external data has no location"),
    Case("external data file missing", _ext({"location": "gone.bin"}), ExternalDataError,
         "file 'gone.bin' not found next to the model"),
    Case("external data as bytes without base_dir", _bytes_with_external, ExternalDataError,
         "model was given without a folder: pass base_dir"),
    Case("external data as a proto without base_dir", _proto_with_external, ExternalDataError,
         "model was given without a folder: pass base_dir"),
]
EXTERNAL = {c.id for c in CASES if c.id.startswith("external")}


def _folders(root: Path) -> Folders:
    folders = Folders(root / "model", root / "outside")
    folders.model.mkdir(parents=True)
    folders.outside.mkdir()
    folders.sentinel.write_bytes(_weights().raw_data)
    return folders


# ---- the Python API ---------------------------------------------------------------------------

_opened: list[str] | None = None  # paths opened while recording


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only inside `recording_opens`


@contextmanager
def recording_opens() -> Iterator[list[str]]:
    global _opened
    _opened = opened = []
    try:
        yield opened
    finally:
        _opened = None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_api_error(case: Case, tmp_path: Path) -> None:
    folders = _folders(tmp_path)
    call = case.build(folders)
    with recording_opens() as opened, pytest.raises(OnnxLensError) as caught:
        onnxlens.analyze(call.source, **call.kwargs)
    error = caught.value
    assert type(error) is case.error, f"{type(error).__name__}: {error}"
    message = str(error)
    assert case.fragment in message
    assert "\n" not in message and "Traceback" not in message
    if case.id in EXTERNAL:
        secret = folders.sentinel.stat()
        for path in opened:
            resolved = Path(path).resolve()
            assert not resolved.is_relative_to(folders.outside.resolve()), path
            if resolved.exists():
                st = resolved.stat()
                assert (st.st_dev, st.st_ino) != (secret.st_dev, secret.st_ino), path


def test_audit_hook_sees_opens(tmp_path: Path) -> None:
    """The hook records both ways of opening a file that the checks above rely on it to see."""
    folders = _folders(tmp_path)
    with recording_opens() as opened:
        with open(folders.sentinel, "rb"):
            pass
        os.close(os.open(folders.sentinel, os.O_RDONLY))
    assert opened == [str(folders.sentinel)] * 2


# ---- the command line -------------------------------------------------------------------------
# A process start costs about a second here, so every case runs through the `analyze` entry point
# in one driver process (fresh argv and captured streams per case, exit codes from SystemExit,
# and what the interpreter would print for an uncaught exception); a few cases also run as real
# `analyze FILE` processes, alongside it.

CLI_CASES = [c for c in CASES if c.build not in (_bytes_with_external, _proto_with_external)]
AS_PROCESS = ("truncated model", "external '..'")

_DRIVER = """
import contextlib, io, json, sys, traceback
from onnxlens.cli import analyze_main
results = []
for args in json.load(sys.stdin):
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = ["analyze", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            analyze_main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append([code, err.getvalue()])
json.dump(results, sys.stdout)
"""


@dataclass
class Outcome:
    returncode: int
    stderr: str


def _analyze_command() -> list[str]:
    script = Path(sys.executable).parent / "analyze"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from onnxlens.cli import analyze_main; analyze_main()"]


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Outcome of each CLI case by id (and of the real processes by "process: " + id)."""
    calls: dict[str, list[str]] = {}
    for case in CLI_CASES:
        call = case.build(_folders(tmp_path_factory.mktemp("cli")))
        assert call.cli is not None
        calls[case.id] = call.cli
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}

    def run(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300,
                              env=env)

    with ThreadPoolExecutor(max_workers=1 + len(AS_PROCESS)) as pool:
        driver = pool.submit(run, [sys.executable, "-c", _DRIVER], json.dumps(list(calls.values())))
        processes = {i: pool.submit(run, [*_analyze_command(), *calls[i]]) for i in AS_PROCESS}
        done = driver.result()
        assert done.returncode == 0, done.stderr
        outcomes = {i: Outcome(*r) for i, r in zip(calls, json.loads(done.stdout), strict=True)}
        for i, future in processes.items():
            out = future.result()
            outcomes[f"process: {i}"] = Outcome(out.returncode, out.stderr)
    return outcomes


def _assert_one_error_line(out: Outcome, fragment: str | None) -> None:
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error:")
    if fragment is not None:
        assert fragment in lines[0]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_cli_error(case: Case, cli_runs: dict[str, Outcome]) -> None:
    # The CLI may word its own checks of its flags.
    _assert_one_error_line(cli_runs[case.id], None if case.error is UsageError else case.fragment)


@pytest.mark.parametrize("case_id", AS_PROCESS)
def test_cli_process_error(case_id: str, cli_runs: dict[str, Outcome]) -> None:
    case = next(c for c in CASES if c.id == case_id)
    _assert_one_error_line(cli_runs[f"process: {case_id}"],
                           None if case.error is UsageError else case.fragment)
