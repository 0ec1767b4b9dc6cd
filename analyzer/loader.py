"""Load an ONNX model safely, pin its dynamic dims and infer every shape.

Order of work: parse (without following external data) -> check every external-data
reference stays inside the model's folder, then read it ourselves -> pin input dims from the
caller -> ``onnx.checker`` -> onnx shape inference (with data propagation) -> ONNX Runtime's
symbolic shape inference only if some tensor is still unknown -> one table of tensor types.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from .errors import ExternalDataError, InvalidModelError, ModelLoadError, ShapeError
from .ir import Dim, Shape, TensorInfo, dtype_bytes

# A tensor bigger than this is taken as a hostile or broken model, not a real one.
DEFAULT_MAX_TENSOR_BYTES = 1 << 38  # 256 GiB
_EXTERNAL_KEYS = {"location", "offset", "length", "checksum", "basepath"}
# Initializers larger than this are swapped for typed graph inputs before shape inference, so
# that onnx does not serialize the weights; small ones (shape constants) stay for data propagation.
_INFERENCE_KEEP_ELEMENTS = 4096


@dataclass
class LoadedModel:
    proto: onnx.ModelProto
    path: Path | None
    name: str
    tensors: dict[str, TensorInfo]
    initializers: dict[str, onnx.TensorProto]
    opset: int
    warnings: list[str] = field(default_factory=list)

    @property
    def graph_inputs(self) -> list[TensorInfo]:
        return [self.tensors[i.name] for i in self.proto.graph.input
                if i.name not in self.initializers]

    @property
    def graph_outputs(self) -> list[TensorInfo]:
        return [self.tensors[o.name] for o in self.proto.graph.output]


def parse_shape_spec(text: str) -> tuple[str, tuple[int, ...]]:
    """``"input=1x3x224x224"`` -> ``("input", (1, 3, 224, 224))``."""
    from .errors import UsageError

    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise UsageError(f"--input-shape {text!r}: expected NAME=DxDx..., e.g. input=1x3x224x224")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise UsageError(f"--input-shape {text!r}: dims must be integers joined by 'x'") from None
    if any(d <= 0 for d in shape):
        raise UsageError(f"--input-shape {text!r}: dims must be positive")
    return name, shape


def load_model(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    base_dir: str | os.PathLike | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    batch: int | None = None,
    max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
) -> LoadedModel:
    path, proto = _parse(source)
    base = Path(base_dir) if base_dir is not None else (path.parent if path else None)
    _load_external_data(proto, base)
    warnings: list[str] = []
    _pin_input_dims(proto, input_shapes or {}, batch, warnings)
    _check_structure(proto.graph)
    _check(proto)
    initializers = {t.name: t for t in proto.graph.initializer}
    inferred = _infer_shapes(proto, initializers, warnings)
    tensors = _tensor_table(inferred, initializers)
    _check_sizes(tensors, max_tensor_bytes)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    name = path.stem if path else (proto.graph.name or "model")
    return LoadedModel(proto, path, name, tensors, initializers, opset, warnings)


def _parse(source: str | os.PathLike | bytes | onnx.ModelProto) -> tuple[Path | None, onnx.ModelProto]:
    if isinstance(source, onnx.ModelProto):
        return None, source
    if isinstance(source, bytes):
        data, path = source, None
    else:
        path = Path(source)
        if not path.exists():
            raise ModelLoadError(f"{path}: no such file")
        if not path.is_file():
            raise ModelLoadError(f"{path}: not a regular file")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ModelLoadError(f"{path}: cannot read ({e.strerror})") from None
    where = str(path) if path else "model bytes"
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{where}: not an ONNX model or truncated ({e})") from None
    # protobuf accepts many non-ONNX byte strings as an empty or partial message.
    if not data or proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelLoadError(f"{where}: not an ONNX model (no ir_version or graph)")
    return path, proto


def _all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of a graph: initializers, Constant values, and those of subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_tensors(g)


def _load_external_data(proto: onnx.ModelProto, base: Path | None) -> None:
    """Read external tensor data ourselves, refusing anything outside the model's folder."""
    for tensor in _all_tensors(proto.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        where = f"initializer {tensor.name!r}: external data"
        unknown = set(info) - _EXTERNAL_KEYS
        if unknown:
            raise ExternalDataError(f"{where} has unknown key(s) {sorted(unknown)}")
        if base is None:
            raise ExternalDataError(f"{where} needs a base folder (model given as bytes)")
        file = _safe_external_path(base, info.get("location", ""), where)
        offset, length = _int_field(info, "offset", where), _int_field(info, "length", where)
        size = file.stat().st_size
        if offset > size or (length is not None and offset + length > size):
            raise ExternalDataError(
                f"{where}: offset {offset} + length {length} runs past the end of "
                f"{info['location']!r} ({size} bytes)")
        with open(file, "rb") as f:
            f.seek(offset)
            tensor.raw_data = f.read(length if length is not None else size - offset)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


def _safe_external_path(base: Path, location: str, where: str) -> Path:
    if not location:
        raise ExternalDataError(f"{where} has no location")
    rel = Path(location)
    if rel.is_absolute() or location.startswith(("/", "\\")) or ":" in location:
        raise ExternalDataError(f"{where} location {location!r} is absolute; only paths "
                                "inside the model's folder are read")
    if ".." in rel.parts:
        raise ExternalDataError(f"{where} location {location!r} contains '..'; only paths "
                                "inside the model's folder are read")
    root = base.resolve()
    file = root
    for part in rel.parts:  # no symlink anywhere on the way, not only at the end
        file = file / part
        if file.is_symlink():
            raise ExternalDataError(f"{where} location {location!r} goes through a symlink")
    if not file.resolve().is_relative_to(root):
        raise ExternalDataError(f"{where} location {location!r} leaves the model's folder")
    try:
        st = file.stat()
    except OSError:
        raise ExternalDataError(f"{where} file {location!r} not found next to the model") from None
    if not stat.S_ISREG(st.st_mode):
        raise ExternalDataError(f"{where} location {location!r} is not a regular file")
    if st.st_nlink > 1:
        raise ExternalDataError(f"{where} file {location!r} is hard-linked elsewhere; refused")
    return file


def _int_field(info: dict[str, str], key: str, where: str) -> int | None:
    if key not in info:
        return 0 if key == "offset" else None
    try:
        value = int(info[key])
    except ValueError:
        raise ExternalDataError(f"{where} {key} {info[key]!r} is not an integer") from None
    if value < 0:
        raise ExternalDataError(f"{where} {key} {value} is negative")
    return value


def _pin_input_dims(proto: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]],
                    batch: int | None, warnings: list[str]) -> None:
    initializer_names = {t.name for t in proto.graph.initializer}
    inputs = {i.name: i for i in proto.graph.input if i.name not in initializer_names}
    unknown = set(input_shapes) - set(inputs)
    if unknown:
        raise ShapeError(f"--input-shape names {sorted(unknown)}, but the model's inputs are "
                         f"{sorted(inputs)}")
    if batch is not None and batch <= 0:
        raise ShapeError(f"--batch {batch}: must be positive")
    for name, value_info in inputs.items():
        tensor_type = value_info.type.tensor_type
        if name in input_shapes:
            wanted = input_shapes[name]
            if tensor_type.HasField("shape") and len(tensor_type.shape.dim) != len(wanted):
                raise ShapeError(f"--input-shape {name}: rank {len(wanted)} given, the model "
                                 f"says rank {len(tensor_type.shape.dim)}")
            del tensor_type.shape.dim[:]
            for d in wanted:
                tensor_type.shape.dim.add().dim_value = d
        elif batch is not None and tensor_type.HasField("shape") and tensor_type.shape.dim:
            first = tensor_type.shape.dim[0]
            if first.HasField("dim_value") and first.dim_value not in (batch,):
                warnings.append(f"input {name!r}: batch dim was fixed at {first.dim_value}; "
                                f"re-inferred at {batch}")
            first.Clear()
            first.dim_value = batch
    # Outputs and value_info may carry the old batch; let inference recompute them.
    if input_shapes or batch is not None:
        del proto.graph.value_info[:]
        for out in proto.graph.output:  # rank stays, dims become unknown
            for d in out.type.tensor_type.shape.dim:
                d.Clear()


def _check_structure(graph: onnx.GraphProto) -> None:
    """Dangling inputs, tensors produced twice and cycles, named in our words.

    onnx's checker reports all three as "not topologically sorted"; these messages say which.
    """
    initializers = {t.name for t in graph.initializer}
    available = {i.name for i in graph.input} | initializers
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for out in node.output:
            if out and (out in producer or out in available):
                raise InvalidModelError(f"tensor {out!r} is produced twice (node "
                                        f"{_node_label(node, index)})")
            if out:
                producer[out] = index
    edges = []
    for index, node in enumerate(graph.node):
        for name in node.input:
            if not name or name in available:
                continue
            if name not in producer:
                raise InvalidModelError(f"node {_node_label(node, index)} reads tensor {name!r}, "
                                        "which no node, input or initializer provides")
            edges.append((producer[name], index))
    for out in graph.output:
        if out.name not in producer and out.name not in available:
            raise InvalidModelError(f"graph output {out.name!r} is produced by no node")
    if any(a >= b for a, b in edges):  # out of file order: a cycle or merely unsorted
        import networkx as nx

        g = nx.DiGraph(edges)
        try:
            cycle = nx.find_cycle(g)
        except nx.NetworkXNoCycle:
            return
        names = " -> ".join(_node_label(graph.node[a], a) for a, _ in cycle)
        raise InvalidModelError(f"graph has a cycle: {names} -> "
                                f"{_node_label(graph.node[cycle[0][0]], cycle[0][0])}")


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return repr(node.name) if node.name else f"#{index} ({node.op_type})"


def _check(proto: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid model"
        raise InvalidModelError(f"onnx checker: {first}") from None
    except ValueError as e:  # e.g. protos over 2 GB
        raise InvalidModelError(f"onnx checker: {e}") from None


def _light_copy(proto: onnx.ModelProto, initializers: dict[str, onnx.TensorProto]) -> onnx.ModelProto:
    """The model with big initializers replaced by typed inputs: same shapes, far fewer bytes."""
    light = _copy_without_initializers(proto)
    declared = {i.name for i in light.graph.input}
    for t in initializers.values():
        if _elements(t.dims) <= _INFERENCE_KEEP_ELEMENTS:
            light.graph.initializer.append(t)
        elif t.name not in declared:
            light.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    return light


def _copy_without_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of everything but the initializers (copying those would copy the weights)."""
    light = onnx.ModelProto(ir_version=proto.ir_version)
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    graph, light_graph = proto.graph, light.graph
    light_graph.name = graph.name
    for field_name in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(light_graph, field_name).extend(getattr(graph, field_name))
    return light


def _elements(dims: object) -> int:
    n = 1
    for d in dims:  # type: ignore[attr-defined]
        n *= d
    return n


def _infer_shapes(proto: onnx.ModelProto, initializers: dict[str, onnx.TensorProto],
                  warnings: list[str]) -> onnx.ModelProto:
    light = _light_copy(proto, initializers)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as e:
        raise ShapeError(f"shape inference: {_first_line(e)}") from None
    except Exception:  # strict mode refuses partial results; retry leniently, then warn
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    if _has_unknown(inferred, initializers):
        inferred = _symbolic_inference(inferred, warnings)
    # The caller's proto gains the inferred value_info, for backends and reports.
    proto.graph.ClearField("value_info")
    proto.graph.value_info.extend(inferred.graph.value_info)
    return inferred


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _has_unknown(proto: onnx.ModelProto, initializers: dict[str, onnx.TensorProto]) -> bool:
    typed = {v.name for v in proto.graph.value_info if _is_fully_known(v)}
    typed |= {v.name for v in proto.graph.input if _is_fully_known(v)}
    typed |= {v.name for v in proto.graph.output if _is_fully_known(v)}
    typed |= set(initializers)
    return any(o and o not in typed for n in proto.graph.node for o in n.output)


def _is_fully_known(v: onnx.ValueInfoProto) -> bool:
    """Every dim a number or a symbol: nothing left for symbolic inference to add."""
    t = v.type.tensor_type
    return t.HasField("shape") and all(d.HasField("dim_value") or d.HasField("dim_param")
                                       for d in t.shape.dim)


def _symbolic_inference(proto: onnx.ModelProto, warnings: list[str]) -> onnx.ModelProto:
    """ONNX Runtime's symbolic shape inference fills what onnx's could not (needs sympy)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except Exception as e:  # onnxruntime or sympy missing: keep onnx's answer
        warnings.append(f"symbolic shape inference unavailable ({type(e).__name__})")
        return proto
    try:
        result = SymbolicShapeInference.infer_shapes(proto, auto_merge=True, guess_output_rank=True)
    except Exception as e:  # its failures are many and unhelpful; onnx's partial answer stands
        warnings.append(f"symbolic shape inference gave up: {_first_line(e)}")
        return proto
    return result if result is not None else proto


def _shape_of(v: onnx.ValueInfoProto) -> Shape | None:
    t = v.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims: list[Dim] = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def _tensor_table(proto: onnx.ModelProto,
                  initializers: dict[str, onnx.TensorProto]) -> dict[str, TensorInfo]:
    table: dict[str, TensorInfo] = {}
    graph = proto.graph
    for v in (*graph.value_info, *graph.input, *graph.output):
        if v.type.HasField("tensor_type"):
            table[v.name] = TensorInfo(v.name, v.type.tensor_type.elem_type, _shape_of(v))
        else:
            table[v.name] = TensorInfo(v.name)
    for t in initializers.values():
        table[t.name] = TensorInfo(t.name, t.data_type, tuple(int(d) for d in t.dims))
    return table


def _check_sizes(tensors: dict[str, TensorInfo], max_tensor_bytes: int) -> None:
    for t in tensors.values():
        if t.shape is None:
            continue
        n = 1
        for d in t.shape:
            if isinstance(d, int):
                if d < 0:
                    raise ShapeError(f"tensor {t.name!r}: negative dimension {d} in {list(t.shape)}")
                n *= d
        if n * dtype_bytes(t.elem_type) > max_tensor_bytes:
            raise ShapeError(
                f"tensor {t.name!r}: shape {list(t.shape)} needs {n * dtype_bytes(t.elem_type):,} "
                f"bytes, over the {max_tensor_bytes:,}-byte limit (--max-tensor-bytes)")
