"""Load an ONNX model safely, pin its dynamic dims and infer every shape.

Order of work: parse (without following external data) -> check external data ourselves, only
from inside the model's folder, by `stat` (offset and length against the file); read only the
small tensors whose values folding and validation use, never the weights -> structure
(dangling tensors, tensors produced twice, cycles), named in our words -> pin input dims from
the caller -> sizes of inputs -> the validation layer (`validate`: opsets, nesting, op
attributes, constant inputs) -> ``onnx.checker`` and onnx shape inference (with data
propagation) on a light copy that leaves the weights out -> ONNX Runtime's symbolic shape
inference only if some tensor is still unknown -> the validation layer's checks on inferred
shapes -> one table of tensor types, every size checked.

Every problem is an `OnnxLensError` with a one-line message naming the node, tensor or field.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import numbers
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from .errors import ExternalDataError, InvalidModelError, ModelLoadError, ShapeError, UsageError
from .fold import MAX_ELEMENTS as MAX_FOLDED_ELEMENTS
from .ir import (
    DEFERRED,
    Dim,
    NodeFields,
    Shape,
    TensorInfo,
    dtype_bytes,
    dtype_name,
    packed_bytes,
    read_nodes,
)
from .validate import CONTRIB_DOMAIN, DEFAULT_LIMITS, Limits, check_text, validate_model

_EXTERNAL_KEYS = frozenset({"location", "offset", "length", "checksum", "basepath"})
# Onnx's checker and shape inference see a light copy of the model: initializers are swapped for
# typed graph inputs, so that onnx does not serialize the weights, except those that can decide
# a shape through data propagation: small integer tensors (Reshape's shape, Slice's starts ...)
# and tiny ones of any type (Resize's float scales).
_SHAPE_CONSTANT_ELEMENTS = 4096
_TINY_ELEMENTS = 16
_INTEGER_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32,
                            onnx.TensorProto.INT16, onnx.TensorProto.INT8,
                            onnx.TensorProto.UINT64, onnx.TensorProto.UINT32,
                            onnx.TensorProto.UINT16, onnx.TensorProto.UINT8})
# ORT's symbolic shape inference is pure Python (about 0.25 ms a node here): past this size it
# would cost more than the rest of the analysis, and pinning the dims is the better answer.
SYMBOLIC_INFERENCE_MAX_NODES = 10_000
# Ops ONNX Runtime registers in the default (ai.onnx) domain itself, which onnx does not know:
# onnxruntime's get_all_operator_schema() minus onnx.defs (1.31; tests/test_loader.py keeps this
# list equal to that difference). onnxruntime-genai's decoders use SimplifiedLayerNormalization.
ORT_DEFAULT_DOMAIN_OPS = frozenset({
    "Affine", "Crop", "DisentangledAttention_TRT", "DynamicSlice", "EfficientNMS_TRT", "GRUUnit",
    "GivenTensorFill", "ImageScaler", "MemcpyFromHost", "MemcpyToHost",
    "MultilevelCropAndResize_TRT", "ParametricSoftplus", "PyramidROIAlign_TRT", "Scale",
    "ScaledTanh", "SimplifiedLayerNormalization"})
_DATA_TYPES = frozenset(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}
# A symbolic dim is kept when it is one of the graph inputs' dim names or an expression of them
# (ORT writes "2*batch", "floor(seq/2)"); names that inference made up ("unk__3", ORT's guesses)
# say nothing and become unknown.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXPRESSION_FUNCTIONS = frozenset({"Min", "Max", "floor", "ceiling", "Mod"})
_INFERENCE_ERROR = re.compile(r"\(op_type:([^,)]*)(?:, node name: (.*?))?\): (?:\[\w+\] )?(.*)")
_CHECKER_NODE = re.compile(r"==> Context: Bad node spec for node\. Name: (.*) OpType: (\S*)")


@dataclass(frozen=True)
class ExternalTensor:
    """Where an initializer's bytes lie in its data file, checked against the file by `stat`
    and left there: `LoadedModel.initializer_array` reads them when a value is needed."""

    file: Path  # resolved, inside the model's folder
    location: str
    offset: int
    length: int
    device: int  # the file checked (st_dev, st_ino): reading it again must find the same file
    inode: int


@dataclass
class LoadedModel:
    proto: onnx.ModelProto
    path: Path | None
    name: str
    tensors: dict[str, TensorInfo]
    initializers: dict[str, onnx.TensorProto]
    opset: int
    nodes: list[NodeFields]  # the main graph's nodes as loaded, their fields read once
    warnings: list[str] = field(default_factory=list)
    # Initializers whose data stays in their file (the proto keeps their external_data), and
    # the folder their locations are relative to.
    external: dict[str, ExternalTensor] = field(default_factory=dict)
    base_dir: Path | None = None
    dims_added: dict[str, int] = field(default_factory=dict)  # pinned as `more_dims` named
    # Graph inputs with a dim the file leaves symbolic (pinned here): a runtime given the file
    # cannot fold a Shape of what depends on them (`runtimes.ort_cpu.folded_at_load`).
    symbolic_inputs: frozenset[str] = frozenset()

    def initializer_array(self, name: str) -> np.ndarray:
        """An initializer's value; one whose data stayed in its file is read from it now."""
        tensor = self.initializers[name]
        ref = self.external.get(name)
        if ref is None:
            return numpy_helper.to_array(tensor)
        inline = onnx.TensorProto()
        inline.CopyFrom(tensor)
        del inline.external_data[:]
        inline.data_location = onnx.TensorProto.DEFAULT
        inline.raw_data = _read_again(ref, name)
        return numpy_helper.to_array(inline)

    @property
    def graph_inputs(self) -> list[TensorInfo]:
        return [self.tensors[i.name] for i in self.proto.graph.input
                if i.name not in self.initializers]

    @property
    def graph_outputs(self) -> list[TensorInfo]:
        return [self.tensors[o.name] for o in self.proto.graph.output]


def parse_dim_spec(text: str) -> tuple[str, int]:
    """``"past_sequence_length=0"`` -> ``("past_sequence_length", 0)`` (``--dim``)."""
    name, sep, value = text.rpartition("=")
    if not sep or not name:
        raise UsageError(f"--dim {text!r}: expected NAME=VALUE, e.g. sequence_length=128")
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"--dim {text!r}: the value must be an integer") from None
    if number < 0:
        raise UsageError(f"--dim {text!r}: the value must be 0 or positive")
    return name, number


def parse_shape_spec(text: str) -> tuple[str, tuple[int, ...]]:
    """``"input=1x3x224x224"`` -> ``("input", (1, 3, 224, 224))``."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise UsageError(f"--input-shape {text!r}: expected NAME=DxDx..., e.g. input=1x3x224x224")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise UsageError(f"--input-shape {text!r}: dims must be integers joined by 'x'") from None
    if any(d < 0 for d in shape):
        raise UsageError(f"--input-shape {text!r}: dims must be 0 or positive")
    return name, shape


def load_model(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    base_dir: str | os.PathLike | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    batch: int | None = None,
    max_tensor_bytes: int | None = None,
    limits: Limits = DEFAULT_LIMITS,
    dims: Mapping[str, int] | None = None,
    more_dims: Callable[[LoadedModel], Mapping[str, int]] | None = None,
) -> LoadedModel:
    """Parse, validate and shape-infer a model given as a path, serialized bytes or a proto.

    `dims` pins named symbolic dims wherever the inputs use them (ORT's free-dimension
    overrides), 0 included; `batch` the first dims left symbolic; `input_shapes` whole inputs.
    `more_dims`, given the model loaded so, names dims to pin beside `dims` (a KV cache's head
    size, read from the attention node): the model comes back as loaded with both, its file
    read, parsed and checked once (only the pins and what follows them run again).

    A proto is copied, never changed. External data is read into the returned proto, from
    `base_dir` (default: the model file's folder) and never from outside it. `limits` bound
    what the model may ask for; `max_tensor_bytes`, when given, replaces its byte budget.
    """
    input_shapes = _check_request(input_shapes or {}, batch)
    dims = _check_dims_request(dims or {})
    if max_tensor_bytes is not None:
        limits = replace(limits, max_tensor_bytes=max_tensor_bytes)
    parsed = _read_model(source, base_dir, limits)
    if more_dims is None:
        return _typed(parsed, input_shapes, batch, dims, limits)
    declared = _declared_io(parsed.proto.graph)
    model = _typed(parsed, input_shapes, batch, dims, limits)
    added = more_dims(model)
    if not added:
        return model
    _restore_io(parsed.proto.graph, declared)
    model = _typed(parsed, input_shapes, batch, _check_dims_request({**dims, **added}), limits)
    model.dims_added = dict(added)
    return model


@dataclass(frozen=True)
class _Parsed:
    """What loading reads once, whatever the pins: the model and its structure, checked."""

    proto: onnx.ModelProto
    path: Path | None
    base: Path | None
    nodes: list[NodeFields]
    external: dict[str, ExternalTensor]
    initializers: dict[str, onnx.TensorProto]
    weights: dict[str, TensorInfo]
    produced: list[str]
    warnings: tuple[str, ...] = ()


def _read_model(source: str | os.PathLike | bytes | onnx.ModelProto,
                base_dir: str | os.PathLike | None, limits: Limits) -> _Parsed:
    path, proto = _parse(source)
    base = Path(base_dir) if base_dir is not None else (path.parent if path else None)
    graph = proto.graph
    nodes = read_nodes(graph.node)
    external = _load_external_data(proto, nodes, base)
    initializers, weights = _initializers(graph)
    produced, order = _check_structure(graph, nodes, initializers)
    if order is None and any(_is_if(n) for n in graph.node):
        # Bodies validated where the file has them (their nesting, their nodes' attributes,
        # named as in the file), before their nodes join the graph
        validate_model(proto, limits=limits, nodes=nodes)
    notes = inline_ifs(graph, limits)
    if notes is not None:  # the branches' nodes in the If's place: read and checked again
        nodes = read_nodes(graph.node)
        initializers, weights = _initializers(graph)
        produced, order = _check_structure(graph, nodes, initializers)
    notes = notes or []
    if order is None:
        return _Parsed(proto, path, base, nodes, external, initializers, weights, produced,
                       tuple(notes))
    # Nodes out of order but no cycle: ONNX Runtime sorts the graph itself and runs it (its
    # float16 converter with keep_io_types appends the input Casts last), so sort it as it does.
    early = _early_read(nodes, order)
    sorted_nodes = [_copied_node(graph.node[i]) for i in order]
    del graph.node[:]
    graph.node.extend(sorted_nodes)
    nodes = read_nodes(graph.node)
    produced, _ = _check_structure(graph, nodes, initializers)
    return _Parsed(proto, path, base, nodes, external, initializers, weights, produced,
                   (*notes, f"{UNSORTED_NODES} ({early}; ONNX requires sorted nodes): analyzed "
                    "sorted, as ONNX Runtime sorts them before running"))


def inline_ifs(graph: onnx.GraphProto, limits: Limits = DEFAULT_LIMITS) -> list[str] | None:
    """Each top-level If replaced by the nodes of the branch it runs, nested ones too (up to
    `Limits.max_nesting_depth` levels); a warning for each whose condition is not a constant
    (None: no If). An If costs what its branch costs, which the analysis can only see inlined:
    Hugging Face optimum's merged decoders (decoder_model_merged.onnx: GPT-2, T5, Whisper ...)
    are one If on the `use_cache_branch` input, the decoder with the cache in its then branch,
    analyzed as 0 MACs before. A condition known only at run time takes the then branch
    (optimum's cached step). A malformed If stays, for validation to name."""
    if not any(_is_if(n) for n in graph.node):
        return None
    notes: list[str] = []
    for _ in range(limits.max_nesting_depth):
        constants = {t.name: t for t in graph.initializer} | {
            n.output[0]: a.t for n in graph.node if n.op_type == "Constant" and n.output
            for a in n.attribute if a.name == "value"}
        kept: list[onnx.NodeProto] = []
        inlined_any = False
        taken = ({n.name for n in graph.node} | {o for n in graph.node for o in n.output}
                 | {v.name for v in (*graph.input, *graph.output, *graph.initializer)})
        for node in graph.node:
            inlined = (_inlined_if(graph, node, constants, taken, notes) if _is_if(node)
                       else None)
            kept += [_copied_node(node)] if inlined is None else inlined
            inlined_any = inlined_any or inlined is not None
        if not inlined_any:
            break
        del graph.node[:]
        graph.node.extend(kept)
    return notes


def _is_if(node: onnx.NodeProto) -> bool:
    return node.op_type == "If" and node.domain in ("", "ai.onnx")


def _inlined_if(graph: onnx.GraphProto, node: onnx.NodeProto,
                constants: Mapping[str, onnx.TensorProto], taken: set[str], notes: list[str]
                ) -> list[onnx.NodeProto] | None:
    """The nodes of the branch `node` runs (None when it is malformed)."""
    condition = constants.get(node.input[0]) if node.input else None
    then = True
    if condition is not None:
        try:
            values = onnx.numpy_helper.to_array(condition).reshape(-1)
        except Exception:  # a tensor numpy cannot read: validation names it
            return None
        if values.size != 1:
            return None
        then = bool(values[0])
    wanted = "then_branch" if then else "else_branch"
    branch = next((a.g for a in node.attribute
                   if a.name == wanted and a.type == onnx.AttributeProto.GRAPH), None)
    if branch is None or len(branch.output) != len(node.output):
        return None
    label = node.name or f"If -> {node.output[0]}"
    if condition is None:
        notes.append(f"{INLINED_IF} {label!r}: its condition {node.input[0]!r} is known only at "
                     "run time; analyzed its then branch (in an optimum merged decoder, the "
                     "step with the cache)")
    return _branch_nodes(graph, branch, f"{label}/{branch.name or wanted}/", list(node.output),
                         taken)


def _branch_nodes(graph: onnx.GraphProto, branch: onnx.GraphProto, prefix: str,
                  outputs: list[str], taken: set[str]) -> list[onnx.NodeProto]:
    """`branch`'s nodes for the outer graph, its initializers moved out, its outputs renamed
    to the If's `outputs` (an Identity where it returns a tensor it does not compute); outer
    names it reads stay. Its own names stay as the file has them unless the graph has them
    already (`taken`: the graph's tensor and node names, which gets those given), then they
    go under `prefix`: ONNX Runtime's profile names a branch's nodes and tensors as the file
    does, and `--measure` maps its kernels back by them."""
    produced = {o for n in branch.node for o in n.output if o}
    own = produced | {t.name for t in branch.initializer}
    rename = {name: prefix + name for name in own if name in taken}
    passed, returned = [], set()
    for value, out in zip(branch.output, outputs, strict=True):
        if value.name in produced and value.name not in returned:
            rename[value.name] = out
            returned.add(value.name)
        else:  # an initializer, an outer tensor or one returned twice: copied to the output
            passed.append(onnx.helper.make_node("Identity", [rename.get(value.name, value.name)],
                                                [out], name=prefix + out))
    taken.update(rename.get(name, name) for name in own)
    for t in branch.initializer:
        moved = onnx.TensorProto()
        moved.CopyFrom(t)
        moved.name = rename.get(t.name, t.name)
        graph.initializer.append(moved)
    nodes = []
    for n in branch.node:
        copy = _copied_node(n)
        copy.name = prefix + n.name if n.name in taken else n.name
        taken.add(copy.name)
        copy.input[:] = [rename.get(i, i) for i in n.input]
        copy.output[:] = [rename.get(o, o) for o in n.output]
        _rename_outer_reads(copy, rename)
        nodes.append(copy)
    return nodes + passed


def _rename_outer_reads(node: onnx.NodeProto, rename: Mapping[str, str]) -> None:
    """What the bodies of `node` (a nested If, Loop, Scan) read from the branch, renamed as
    the branch's tensors were; a body's own tensors of the same names shadow them."""
    for attr in node.attribute:
        for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            own = ({t.name for t in body.initializer} | {i.name for i in body.input}
                   | {o for n in body.node for o in n.output})
            outer = {k: v for k, v in rename.items() if k not in own}
            for value in body.output:
                value.name = outer.get(value.name, value.name)
            for inner in body.node:
                inner.input[:] = [outer.get(i, i) for i in inner.input]
                _rename_outer_reads(inner, outer)


UNSORTED_NODES = "nodes are not in topological order"
INLINED_IF = "inlined If"
# What loading rewrote in the file, said once: an analysis that reloads the rewritten proto
# (the symbolic path) finds nothing to say again.
REWRITE_NOTES = (UNSORTED_NODES, INLINED_IF)


def _copied_node(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def _early_read(nodes: list[NodeFields], order: list[int]) -> str:
    """The first read of a tensor before its producer, in the file's order, in words."""
    producer = {out: i for i, node in enumerate(nodes) for out in node.outputs if out}
    for index, node in enumerate(nodes):
        for name in node.inputs:
            if producer.get(name, -1) > index:
                return (f"node {_node_label(node, index)} reads tensor {name!r} before node "
                        f"{_node_label(nodes[producer[name]], producer[name])} produces it")
    return f"{len(order)} nodes"


def _typed(parsed: _Parsed, input_shapes: Mapping[str, tuple[int, ...]], batch: int | None,
           dims: Mapping[str, int], limits: Limits) -> LoadedModel:
    """The model with its inputs pinned, validated and its shapes inferred (in `parsed.proto`,
    which gets the pins and the inferred types)."""
    proto, nodes, initializers = parsed.proto, parsed.nodes, parsed.initializers
    max_tensor_bytes = limits.max_tensor_bytes
    graph = proto.graph
    warnings: list[str] = list(parsed.warnings)
    symbolic = frozenset(i.name for i in graph.input if i.name not in initializers and any(
        not d.HasField("dim_value") for d in i.type.tensor_type.shape.dim))
    pinned = _pin_input_dims(graph, initializers, input_shapes, batch, dims, warnings)
    inputs = [i for i in graph.input if i.name not in initializers]
    for value in inputs:
        _check_value_dims(value, max_tensor_bytes)
    validation = validate_model(proto, limits=limits, nodes=nodes)
    warnings += validation.warnings
    light = _light_copy(proto, initializers, parsed.weights, parsed.external, max_tensor_bytes)
    validation.make_inference_safe(light)
    _runtime_ops_to_contrib_domain(light, nodes, warnings)
    serialized = light.SerializeToString()  # once, for both the checker and inference
    _check(serialized, light.graph)
    symbols = {d.dim_param for i in inputs for d in i.type.tensor_type.shape.dim if d.dim_param}
    inferred, tensors = _infer_shapes(light, serialized, parsed.weights, symbols,
                                      parsed.produced, pinned, warnings,
                                      data_prop=validation.data_prop)
    warnings += validation.check_shapes(tensors)
    _check_sizes(tensors, max_tensor_bytes)
    # The returned proto carries the inferred types, for backends and reports.
    del graph.value_info[:]
    graph.value_info.extend(inferred.graph.value_info)
    for out, typed in zip(graph.output, inferred.graph.output, strict=True):
        out.type.CopyFrom(typed.type)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    path = parsed.path
    name = path.stem if path else (graph.name or "model")
    return LoadedModel(proto, path, name, tensors, initializers, opset, nodes, warnings,
                       parsed.external, parsed.base, symbolic_inputs=symbolic)


def _declared_io(graph: onnx.GraphProto) -> tuple[list[onnx.ValueInfoProto], ...]:
    """Copies of the graph's inputs and outputs as the model declares them (pinning and
    inference change them in place)."""
    return tuple([_copied(v) for v in values] for values in (graph.input, graph.output))


def _copied(value: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    return copy


def _restore_io(graph: onnx.GraphProto, declared: tuple[list[onnx.ValueInfoProto], ...]
                ) -> None:
    for values, saved in zip((graph.input, graph.output), declared, strict=True):
        del values[:]
        values.extend(saved)


# ---- the request ------------------------------------------------------------------------------


def _check_request(input_shapes: Mapping[str, Iterable[int]], batch: int | None
                   ) -> dict[str, tuple[int, ...]]:
    """The caller's pins, as plain tuples of ints >= 0 (a 0 dim is an empty tensor: a KV
    cache before the first token)."""
    if batch is not None and not _is_positive(batch):
        raise UsageError(f"--batch {batch}: the batch must be a positive integer")
    shapes: dict[str, tuple[int, ...]] = {}
    for name, dims in input_shapes.items():
        wanted = tuple(dims) if isinstance(dims, Iterable) and not isinstance(dims, str) else ()
        if not wanted or not all(_is_positive(d) or d == 0 for d in wanted):
            raise UsageError(f"--input-shape {name}: dims must be integers >= 0, got {dims}")
        shapes[name] = tuple(int(d) for d in wanted)
    return shapes


def _check_dims_request(dims: Mapping[str, int]) -> dict[str, int]:
    """Named dims pinned to integers >= 0 (0: an empty tensor, costing nothing)."""
    for name, value in dims.items():
        if not (_is_positive(value) or (isinstance(value, numbers.Integral)
                                        and not isinstance(value, bool) and value == 0)):
            raise UsageError(f"--dim {name}={value}: the value must be an integer >= 0")
    return {name: int(value) for name, value in dims.items()}


def _is_positive(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0


# ---- parsing ----------------------------------------------------------------------------------


def _parse(source: str | os.PathLike | bytes | onnx.ModelProto
           ) -> tuple[Path | None, onnx.ModelProto]:
    if isinstance(source, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(source)
        return None, proto
    if isinstance(source, bytes):
        data, path = source, None
    else:
        path = Path(source)
        data = _read_model_file(path)
    where = str(path) if path else "model bytes"
    if not data:
        raise ModelLoadError(f"{where}: empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        if data.startswith(b"PK\x03\x04"):
            raise ModelLoadError(f"{where}: a zip archive (a PyTorch checkpoint?), "
                                 "not an ONNX model") from None
        raise ModelLoadError(f"{where}: not an ONNX model, or truncated "
                             "(protobuf parsing failed)") from None
    # protobuf accepts many non-ONNX byte strings as an empty or partial message.
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelLoadError(f"{where}: not an ONNX model (no ir_version or no graph)")
    return path, proto


def _read_model_file(path: Path) -> bytes:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file") from None
    except ValueError:  # a NUL in the name
        raise ModelLoadError(f"{str(path)!r}: not a valid file name") from None
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelLoadError(f"{path}: a directory, not an ONNX file")
    if not stat.S_ISREG(st.st_mode):
        raise ModelLoadError(f"{path}: not a regular file")
    try:
        return path.read_bytes()
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read ({e.strerror})") from None


# ---- external data ----------------------------------------------------------------------------


def _all_tensors(graph: onnx.GraphProto, nodes: Iterable[NodeFields]
                 ) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of a graph: initializers, Constant values, and those of subgraphs."""
    yield from graph.initializer
    yield from _tensors_beside_initializers(graph, nodes)


def _tensors_beside_initializers(graph: onnx.GraphProto, nodes: Iterable[NodeFields]
                                 ) -> Iterator[onnx.TensorProto]:
    """A graph's sparse initializers and Constant values, and every tensor of its subgraphs."""
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in nodes:
        for _, kind, value in node.attributes:
            if value is DEFERRED:
                continue
            if kind == onnx.AttributeProto.TENSOR:
                yield value
            elif kind == onnx.AttributeProto.GRAPH:
                yield from _all_tensors(value, read_nodes(value.node))
            elif kind == onnx.AttributeProto.GRAPHS:
                for g in value:
                    yield from _all_tensors(g, read_nodes(g.node))


@dataclass
class _DataFile:
    file: BinaryIO
    path: Path
    stat: os.stat_result


def _load_external_data(proto: onnx.ModelProto, nodes: list[NodeFields], base: Path | None
                        ) -> dict[str, ExternalTensor]:
    """Check every tensor's external data against its file, refusing anything outside the
    model's folder; read the small main-graph initializers whose values folding and
    validation use (and any other tensor: Constant values, subgraphs), leave the rest there.

    Returns the initializers left in their files, by name.
    """
    files: dict[str, _DataFile] = {}
    left: dict[str, ExternalTensor] = {}
    try:
        for tensor in proto.graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                ref = _check_external(tensor, base, files)
                if _values_needed(tensor):
                    _inline(tensor, _read(files[ref.location], ref, tensor.name))
                else:
                    left[tensor.name] = ref
        for tensor in _tensors_beside_initializers(proto.graph, nodes):
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                ref = _check_external(tensor, base, files)
                _inline(tensor, _read(files[ref.location], ref, tensor.name))
    finally:
        for f in files.values():
            f.file.close()
    return left


def _values_needed(tensor: onnx.TensorProto) -> bool:
    """Small tensors are read: shape constants, indices, scales, the values that constant
    folding (`fold.MAX_ELEMENTS`) and the validation layer look at. Weights are not."""
    return math.prod(tensor.dims) <= MAX_FOLDED_ELEMENTS


def _inline(tensor: onnx.TensorProto, data: bytes) -> None:
    tensor.raw_data = data
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT


def _check_external(tensor: onnx.TensorProto, base: Path | None,
                    files: dict[str, _DataFile]) -> ExternalTensor:
    """Where the tensor's bytes lie, checked by `stat`: a file inside `base`, offset and length
    within it, and the length its dims and type need. Nothing is read."""
    where = f"tensor {tensor.name!r}: external data"
    info: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key not in _EXTERNAL_KEYS:
            raise ExternalDataError(f"{where} has unknown key {entry.key!r} (known: "
                                    f"{', '.join(sorted(_EXTERNAL_KEYS))})")
        if not isinstance(entry.value, str):  # protobuf gives invalid UTF-8 as bytes
            raise ExternalDataError(f"{where} {entry.key} {entry.value[:60]!r} is not valid "
                                    "UTF-8 text")
        info[entry.key] = entry.value
    location = info.get("location", "")
    if base is None:
        raise ExternalDataError(f"{where} in {location!r}, but the model was given without a "
                                "folder: pass base_dir")
    if location not in files:
        files[location] = _open_inside(base, location, where)
    data_file = files[location]
    size = data_file.stat.st_size
    offset = _int_field(info, "offset", where) or 0
    length = _int_field(info, "length", where)
    if offset > size:
        raise ExternalDataError(f"{where}: offset {offset} is past the end of {location!r} "
                                f"({size} bytes)")
    if length is None:
        length = size - offset
    elif offset + length > size:
        raise ExternalDataError(f"{where}: offset {offset} + length {length} runs past the end "
                                f"of {location!r} ({size} bytes)")
    needed = _stored_bytes(tensor)
    if needed is not None and length != needed:
        raise ExternalDataError(f"{where}: {length:,} bytes at offset {offset} of {location!r} "
                                f"({size:,} bytes), but its shape {_show(tensor.dims)} of "
                                f"{dtype_name(tensor.data_type)} needs {needed:,} (a truncated "
                                "or mismatched file)")
    return ExternalTensor(data_file.path, location, offset, length, data_file.stat.st_dev,
                          data_file.stat.st_ino)


def _stored_bytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes of the tensor's data as ONNX stores it (sub-byte types packed); None when its
    type or dims are invalid (the checks after this name those)."""
    if (tensor.data_type not in _DATA_TYPES or tensor.data_type == onnx.TensorProto.STRING
            or any(d < 0 for d in tensor.dims)):
        return None
    return packed_bytes(tensor.data_type, math.prod(tensor.dims))


def _read(data_file: _DataFile, ref: ExternalTensor, name: str) -> bytes:
    data_file.file.seek(ref.offset)
    data = data_file.file.read(ref.length)
    if len(data) != ref.length:
        raise ExternalDataError(f"tensor {name!r}: external data {ref.location!r} changed while "
                                "being read")
    return data


def _read_again(ref: ExternalTensor, name: str) -> bytes:
    """A tensor's bytes, read when its value is needed: from the file that was checked (the
    same device and inode, opened without following a symlink), still long enough."""
    where = f"tensor {name!r}: external data {ref.location!r}"
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(ref.file, flags)
    except OSError as e:
        raise ExternalDataError(f"{where}: cannot read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (ref.device, ref.inode) or st.st_nlink > 1:
            raise ExternalDataError(f"{where}: the file changed since the model was loaded")
        return _read(_DataFile(f, ref.file, st), ref, name)


def _open_inside(base: Path, location: str, where: str) -> _DataFile:
    """Open `location` read-only if it names a regular, singly-linked file inside `base`."""
    refuse = f"{where} location {location!r}"
    inside = "only files inside the model's folder are read"
    if not location:
        raise ExternalDataError(f"{where} has no location")
    if "\0" in location:
        raise ExternalDataError(f"{refuse} contains a NUL character")
    if Path(location).is_absolute() or re.match(r"[/\\]|[A-Za-z]:", location):
        raise ExternalDataError(f"{refuse} is absolute; {inside}")
    if ".." in re.split(r"[/\\]", location):
        raise ExternalDataError(f"{refuse} contains '..'; {inside}")
    root = base.resolve()
    file = (root / location).resolve()  # follows every symlink on the way
    if not file.is_relative_to(root):
        raise ExternalDataError(f"{refuse} leads out of the model's folder through a symlink; "
                                f"{inside}")
    try:
        st = file.stat()
    except OSError:
        raise ExternalDataError(f"{where} file {location!r} not found next to the model"
                                ) from None
    if not stat.S_ISREG(st.st_mode):
        raise ExternalDataError(f"{refuse} is not a regular file")
    if st.st_nlink > 1:
        raise ExternalDataError(f"{where} file {location!r} has other hard links (it may be a "
                                "file from outside the model's folder); refused")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(file, flags)
    except OSError as e:
        raise ExternalDataError(f"{where} file {location!r}: cannot read ({e.strerror})"
                                ) from None
    opened = os.fstat(fd)  # the file opened is the file checked
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino) or opened.st_nlink > 1:
        os.close(fd)
        raise ExternalDataError(f"{where} file {location!r} changed while being opened")
    return _DataFile(os.fdopen(fd, "rb"), file, opened)


def _int_field(info: dict[str, str], key: str, where: str) -> int | None:
    if key not in info:
        return None
    try:
        value = int(info[key])
    except ValueError:
        raise ExternalDataError(f"{where} {key} {info[key]!r} is not an integer") from None
    if value < 0:
        raise ExternalDataError(f"{where} {key} {value} is negative")
    return value


# ---- structure --------------------------------------------------------------------------------


def _initializers(graph: onnx.GraphProto
                  ) -> tuple[dict[str, onnx.TensorProto], dict[str, TensorInfo]]:
    """The initializers by name, and their types (their fields read once: reading a proto field
    is slow, and the light copy and the tensor table both need them)."""
    initializers: dict[str, onnx.TensorProto] = {}
    weights: dict[str, TensorInfo] = {}
    for t in graph.initializer:
        name = t.name
        check_text(name, "initializer")
        if name in initializers:
            raise InvalidModelError(f"initializer {name!r} is defined twice")
        initializers[name] = t
        weights[name] = TensorInfo(name, t.data_type, tuple(t.dims))
    return initializers, weights


def _check_structure(graph: onnx.GraphProto, nodes: list[NodeFields],
                     initializers: Mapping[str, onnx.TensorProto]
                     ) -> tuple[list[str], list[int] | None]:
    """Dangling inputs, tensors produced twice and cycles, named in our words (onnx's checker
    reports all of them as "not topologically sorted"; these messages say which).

    Returns the names of the tensors the nodes produce, and for nodes out of order without a
    cycle a topological order of their indices (None when sorted already).
    """
    provided = dict.fromkeys(initializers, "an initializer")
    for t in graph.sparse_initializer:
        provided[t.values.name] = "a sparse initializer"
    for value in graph.input:
        if provided.get(value.name) == "a graph input":
            raise InvalidModelError(f"graph input {value.name!r} is declared twice")
        provided.setdefault(value.name, "a graph input")
    producer: dict[str, int] = {}
    early_reads: list[tuple[str, int]] = []  # (tensor, reader) read before it is produced
    for index, node in enumerate(nodes):
        for name in node.inputs:
            if name and name not in provided and name not in producer:
                early_reads.append((name, index))
        for out in node.outputs:
            if not out:
                continue
            if out.__class__ is not str:  # inputs name graph inputs, initializers or outputs
                check_text(out, f"node {_node_label(node, index)} output")
            if out in producer:
                raise InvalidModelError(
                    f"tensor {out!r} is produced twice, by node "
                    f"{_node_label(nodes[producer[out]], producer[out])} and node "
                    f"{_node_label(node, index)}")
            if out in provided:
                raise InvalidModelError(f"tensor {out!r} is {provided[out]} and is also produced "
                                        f"by node {_node_label(node, index)}")
            producer[out] = index
    for name, index in early_reads:
        if name not in producer:
            raise InvalidModelError(f"node {_node_label(nodes[index], index)} reads tensor "
                                    f"{name!r}, which no node, graph input or initializer "
                                    "provides")
    for out in graph.output:
        if out.name not in producer and out.name not in provided:
            raise InvalidModelError(f"graph output {out.name!r} is produced by no node")
    return list(producer), _sorted_order(nodes, producer) if early_reads else None


def _sorted_order(node_list: list[NodeFields], producer: dict[str, int]) -> list[int]:
    """A node reads a tensor produced later in the file: a cycle (refused), or nodes out of
    order, whose topological order is returned, the file's wherever it allows."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(len(node_list)))
    for index, node in enumerate(node_list):
        g.add_edges_from((producer[name], index) for name in node.inputs if name in producer)
    try:
        cycle = [a for a, _ in nx.find_cycle(g)]
    except nx.NetworkXNoCycle:
        return list(nx.lexicographical_topological_sort(g))
    start = cycle.index(min(cycle))  # from the node that comes first in the file
    cycle = cycle[start:] + cycle[:start]
    names = " -> ".join(_node_label(node_list[i], i) for i in [*cycle, cycle[0]])
    raise InvalidModelError(f"graph has a cycle: nodes {names}")


def _node_label(node: NodeFields | onnx.NodeProto, index: int) -> str:
    return repr(node.name) if node.name else f"#{index} ({node.op_type})"


# ---- pinning and sizes ------------------------------------------------------------------------


def _pin_input_dims(graph: onnx.GraphProto, initializers: Mapping[str, onnx.TensorProto],
                    input_shapes: Mapping[str, tuple[int, ...]], batch: int | None,
                    dims: Mapping[str, int], warnings: list[str]) -> bool:
    """Fix input dims as asked; True if anything was asked (stale recorded shapes are dropped).

    `batch` replaces each input's symbolic first dim, wherever that symbol appears; in a model
    with no symbolic first dim it overrides the fixed ones, with a warning. `dims` replaces each
    named dim wherever it appears, and wins over `batch` (an input whose first dim it names is
    left to it). `input_shapes` replace whole inputs.
    """
    inputs = {i.name: i for i in graph.input if i.name not in initializers}
    for name in input_shapes:
        if name not in inputs:
            raise ShapeError(f"--input-shape {name}: the model has no input {name!r}; its "
                             f"inputs are {', '.join(map(repr, inputs)) or 'none'}")
    if batch is not None:
        _pin_batch([v for n, v in inputs.items() if n not in input_shapes
                    and not _first_dim_named(v, dims)], batch, warnings)
    if dims:
        _pin_named_dims(list(inputs.values()), dims, frozenset(input_shapes))
    for name, wanted in input_shapes.items():
        if not inputs[name].type.HasField("tensor_type"):
            raise ShapeError(f"--input-shape {name}: input {name!r} is not a tensor")
        tensor_type = inputs[name].type.tensor_type
        dims = tensor_type.shape.dim
        if tensor_type.HasField("shape") and len(dims) != len(wanted):
            raise ShapeError(f"--input-shape {name}: rank {len(wanted)} given, but input "
                             f"{name!r} has rank {len(dims)}")
        fixed = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        if any(f is not None and f != w for f, w in zip(fixed, wanted, strict=False)):
            warnings.append(f"input {name!r}: fixed shape {_show(fixed)} replaced by "
                            f"{_show(wanted)}")
        del dims[:]
        for d in wanted:
            tensor_type.shape.dim.add().dim_value = d
    if not input_shapes and batch is None and not dims:
        return False
    # Recorded shapes may carry the old dims: inference recomputes them (ranks stay for the
    # checker, which wants a shape on every graph output).
    del graph.value_info[:]
    for out in graph.output:
        for d in out.type.tensor_type.shape.dim:
            d.Clear()
    return True


def _first_dim_named(value: onnx.ValueInfoProto, dims: Mapping[str, int]) -> bool:
    shape = value.type.tensor_type.shape.dim
    return bool(shape) and shape[0].dim_param in dims


def _pin_named_dims(inputs: list[onnx.ValueInfoProto], dims: Mapping[str, int],
                    replaced: frozenset[str]) -> None:
    """Every input dim named in `dims` gets its value (but in the inputs `replaced` whole); a
    name no input uses is an error."""
    found = {v.name: [d for d in v.type.tensor_type.shape.dim if d.dim_param] for v in inputs}
    names = list(dict.fromkeys(d.dim_param for named in found.values() for d in named))
    unknown = [n for n in dims if n not in names]
    if unknown:
        raise ShapeError(f"--dim {unknown[0]}: the model has no symbolic dim {unknown[0]!r}; "
                         f"its symbolic dims are {', '.join(names) or 'none'}")
    for name, named in found.items():
        for d in named if name not in replaced else ():
            if d.dim_param in dims:
                d.dim_value = dims[d.dim_param]


def _pin_batch(inputs: list[onnx.ValueInfoProto], batch: int, warnings: list[str]) -> None:
    firsts = {v.name: v.type.tensor_type.shape.dim[0] for v in inputs
              if v.type.tensor_type.shape.dim}
    symbols = {d.dim_param for d in firsts.values() if d.dim_param}
    if symbols:
        for value in inputs:
            for d in value.type.tensor_type.shape.dim:
                if d.dim_param in symbols:
                    d.dim_value = batch
        return
    for name, first in firsts.items():
        if first.HasField("dim_value") and first.dim_value != batch:
            warnings.append(f"input {name!r}: batch dim was fixed at {first.dim_value}; "
                            f"analyzed at {batch}")
        first.dim_value = batch


def _show(dims: Iterable[Dim]) -> str:
    return "x".join("?" if d is None else str(d) for d in dims)


def _check_value_dims(value: onnx.ValueInfoProto, max_tensor_bytes: int) -> None:
    _check_dims(f"input {value.name!r}", _dims_of(value), value.type.tensor_type.elem_type,
                max_tensor_bytes)


def _check_dims(what: str, shape: Sequence[Dim], elem_type: int, max_tensor_bytes: int) -> None:
    """Known dims must be >= 0 and what they hold within the byte budget (a lower bound when
    some dims are symbolic)."""
    dims = [d for d in shape if isinstance(d, int)]
    negative = [d for d in dims if d < 0]
    if negative:
        raise ShapeError(f"{what}: negative dimension {negative[0]} in shape {_show(shape)}")
    nbytes = math.prod(dims) * dtype_bytes(elem_type)
    if nbytes > max_tensor_bytes:
        raise ShapeError(f"{what}: shape {_show(shape)} needs {nbytes:,} bytes, over the "
                         f"{max_tensor_bytes:,}-byte limit (--max-tensor-bytes)")
    huge = [d for d in dims if d > max_tensor_bytes]  # beside a 0, the product hides it
    if huge:
        raise ShapeError(f"{what}: dimension {huge[0]:,} in shape {_show(shape)} is over the "
                         f"{max_tensor_bytes:,}-byte limit (--max-tensor-bytes)")


def _light_copy(proto: onnx.ModelProto, initializers: dict[str, onnx.TensorProto],
                weights: Mapping[str, TensorInfo], external: Mapping[str, ExternalTensor],
                max_tensor_bytes: int) -> onnx.ModelProto:
    """The model with its weights replaced by typed inputs: same shapes, far fewer bytes.

    Every initializer is checked here (the checker sees only those kept in the copy; the others
    get its tensor checks one by one, but those left in their files, whose length was checked
    against their shape when loading: onnx would look for the file itself).
    """
    light = onnx.ModelProto(ir_version=proto.ir_version)
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    graph, light_graph = proto.graph, light.graph
    light_graph.name = graph.name
    for field_name in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(light_graph, field_name).extend(getattr(graph, field_name))
    declared = {i.name for i in graph.input}
    types: dict[tuple[int, Shape | None], onnx.TypeProto] = {}
    kept: list[onnx.TensorProto] = []
    for name, t in initializers.items():
        weight = weights[name]
        key = (weight.elem_type, weight.shape)
        if key not in types:
            types[key] = _initializer_type(t, max_tensor_bytes)
        elements = weight.size
        if elements <= _TINY_ELEMENTS or (elements <= _SHAPE_CONSTANT_ELEMENTS
                                          and weight.elem_type in _INTEGER_TYPES):
            kept.append(t)
            continue
        if name not in external:
            try:
                onnx.checker.check_tensor(t)
            except onnx.checker.ValidationError as e:
                raise InvalidModelError(f"initializer {name!r}: {_first_line(e)}") from None
        if name not in declared:
            value = light_graph.input.add()
            value.name = name
            value.type.CopyFrom(types[key])
    light_graph.initializer.extend(kept)
    return light


def _runtime_ops_to_contrib_domain(light: onnx.ModelProto, nodes: list[NodeFields],
                                   warnings: list[str]) -> None:
    """ONNX Runtime's own default-domain ops, which onnx's checker refuses ("No Op registered
    for SimplifiedLayerNormalization"), move to ORT's contrib domain in the copy that the
    checker and shape inference see: onnx skips them, ORT's symbolic inference gives their
    shapes. The model itself keeps them as written (their cost formulas are registered
    there)."""
    # Found in the fields read once (`nodes`, in the copy's order): each read of a proto field
    # builds an object.
    moved = [i for i, n in enumerate(nodes)
             if n.op_type in ORT_DEFAULT_DOMAIN_OPS and n.domain in ("", "ai.onnx")]
    if not moved:
        return
    light_nodes = light.graph.node
    for i in moved:
        light_nodes[i].domain = CONTRIB_DOMAIN
    if all(o.domain != CONTRIB_DOMAIN for o in light.opset_import):
        light.opset_import.add(domain=CONTRIB_DOMAIN, version=1)
    op_types = sorted({nodes[i].op_type for i in moved})
    warnings.append(f"ONNX Runtime's own op(s) {', '.join(op_types)} in the default domain: not "
                    "ONNX ops (onnx's checker skips them); their shapes come from ONNX "
                    "Runtime's symbolic inference")


def _initializer_type(t: onnx.TensorProto, max_tensor_bytes: int) -> onnx.TypeProto:
    """The type of an initializer as a graph input, once its dtype and dims are checked."""
    if t.data_type not in _DATA_TYPES:
        raise InvalidModelError(f"initializer {t.name!r}: unknown data type {t.data_type}")
    _check_dims(f"initializer {t.name!r}", list(t.dims), t.data_type, max_tensor_bytes)
    return onnx.helper.make_tensor_type_proto(t.data_type, t.dims)


def _check(serialized: bytes, graph: onnx.GraphProto) -> None:
    try:
        onnx.checker.check_model(serialized)
    except (onnx.checker.ValidationError, ValueError) as e:
        raise InvalidModelError(f"onnx checker: {_checker_message(str(e), graph)}") from None


def _checker_message(text: str, graph: onnx.GraphProto) -> str:
    """The checker's first line, with the node or graph input/output it is about."""
    first = _first_line_of(text) or "invalid model"
    node = _CHECKER_NODE.search(text)
    if node:
        return f"node {node.group(1)!r} ({node.group(2)}): {first}"
    if "Field 'shape' of 'type'" in first:
        for kind, values in (("input", graph.input), ("output", graph.output)):
            for v in values:
                if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape"):
                    return f"graph {kind} {v.name!r} has no shape ({first})"
    return first


def _infer_shapes(light: onnx.ModelProto, serialized: bytes,
                  weights: Mapping[str, TensorInfo], symbols: set[str],
                  produced: list[str], pinned: bool, warnings: list[str], *, data_prop: bool
                  ) -> tuple[onnx.ModelProto, dict[str, TensorInfo]]:
    """onnx's inference (strict), then ORT's symbolic inference for what is still unknown.

    `data_prop`: onnx's data propagation (shapes computed from shapes); off for models where
    it would take minutes (`validate.Validation.data_prop`).

    Strict mode fails on a node whose own inference fails (ORT refuses such a model too): that
    is a `ShapeError` naming the node. It also fails when the shapes recorded in the model
    disagree with the inferred ones; then the recorded ones are dropped and inference retried.
    """
    try:
        inferred = _onnx_inference(serialized, data_prop)
    except Exception as e:
        if pinned:  # nothing recorded is left to drop
            raise ShapeError(_inference_failure(e, light, data_prop)) from None
        bare = _without_recorded_shapes(light)
        try:
            inferred = _onnx_inference(bare, data_prop)
        except Exception as e2:
            raise ShapeError(_inference_failure(e2, bare, data_prop)) from None
        warnings.append(_disagreement(light, inferred, e))
    tensors = _tensor_table(inferred.graph, weights, symbols)
    if not _has_unknown(produced, tensors):
        return inferred, tensors
    inferred, tensors = _fold_and_infer(inferred, tensors, weights, symbols, data_prop)
    if not _has_unknown(produced, tensors):
        return inferred, tensors
    if len(inferred.graph.node) > SYMBOLIC_INFERENCE_MAX_NODES:
        warnings.append(f"some shapes are unknown; ONNX Runtime's symbolic shape inference is "
                        f"skipped on models over {SYMBOLIC_INFERENCE_MAX_NODES:,} nodes (slow): "
                        "pin the dims with --batch or --input-shape")
        return inferred, tensors
    inferred = _symbolic_inference(inferred, warnings)
    tensors = _tensor_table(inferred.graph, weights, symbols)
    return inferred, tensors


def _fold_and_infer(inferred: onnx.ModelProto, tensors: dict[str, TensorInfo],
                    weights: Mapping[str, TensorInfo], symbols: set[str],
                    data_prop: bool, rounds: int = 16
                    ) -> tuple[onnx.ModelProto, dict[str, TensorInfo]]:
    """Evaluate shape subgraphs that known shapes make constant (`fold`), infer again.

    Each round may reveal more shapes (Swin: one stage per round), and so more foldable
    subgraphs. Between rounds only the shapes that `Shape` nodes read are looked up; the full
    tensor table is built once at the end. The model that comes back still has every node;
    folded tensors get their value's type.
    """
    from .fold import fold_shape_subgraphs

    read_by_shape = {n.input[0] for n in inferred.graph.node if n.op_type == "Shape"}
    shapes: Mapping[str, TensorInfo] = tensors
    known: dict[str, np.ndarray] = {}
    constants: list[onnx.TensorProto] = []
    result = None
    for _ in range(rounds):
        folded = fold_shape_subgraphs(inferred, shapes, known)
        new = [name for name in folded if name not in known]
        if not new:
            break
        known = folded
        constants += [numpy_helper.from_array(known[name], name) for name in new]
        constant = onnx.ModelProto()
        constant.CopyFrom(inferred)
        graph = constant.graph
        kept = [n for n in graph.node if not all(o in known for o in n.output if o)]
        del graph.node[:]
        graph.node.extend(kept)
        graph.initializer.extend(constants)
        del graph.value_info[:]  # inferred afresh: a stale guess ("unk__3") would stick
        try:
            result = _onnx_inference(constant, data_prop)
        except Exception:  # folding must never make loading fail: keep what we had
            break
        shapes = {v.name: TensorInfo(v.name, *_type_of(v.type, symbols))
                  for v in (*result.graph.value_info, *result.graph.input)
                  if v.name in read_by_shape}
    if result is None:
        return inferred, tensors
    del inferred.graph.value_info[:]
    inferred.graph.value_info.extend(result.graph.value_info)
    inferred.graph.value_info.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in constants)
    for out, typed in zip(inferred.graph.output, result.graph.output, strict=True):
        out.type.CopyFrom(typed.type)
    return inferred, _tensor_table(inferred.graph, weights, symbols)


def _onnx_inference(model: onnx.ModelProto | bytes, data_prop: bool) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=data_prop)


def _without_recorded_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    for out in bare.graph.output:
        for d in out.type.tensor_type.shape.dim:
            d.Clear()
    return bare


def _inference_failure(e: Exception, model: onnx.ModelProto, data_prop: bool) -> str:
    """"...at node 'mm' (MatMul): Incompatible dimensions ... (inputs 'a' 2x3, 'b' 4x5)"."""
    match = _INFERENCE_ERROR.search(str(e))
    if match is None:
        return f"shape inference failed: {_first_line(e)}"
    op_type, name, reason = match.group(1), match.group(2) or "", match.group(3)
    graph = model.graph
    if not name:  # onnx names no unnamed node: name them by index and ask again
        named = onnx.ModelProto()
        named.CopyFrom(model)
        for index, node in enumerate(named.graph.node):
            node.name = node.name or f"#{index}"
        try:
            _onnx_inference(named, data_prop)
        except Exception as again:
            match = _INFERENCE_ERROR.search(str(again)) or match
            op_type, name, reason = match.group(1), match.group(2) or "", match.group(3)
        graph = named.graph
    index = next((i for i, n in enumerate(graph.node) if n.name == name and n.op_type == op_type),
                 None)
    if index is None:
        return f"shape inference failed at a {op_type} node: {reason}"
    node = model.graph.node[index]
    label = f"{node.name!r} ({op_type})" if node.name else _node_label(node, index)
    return (f"shape inference failed at node {label}: {reason}"
            f"{_input_shapes(model, node, data_prop)}")


def _input_shapes(model: onnx.ModelProto, node: onnx.NodeProto, data_prop: bool) -> str:
    """" (inputs 'a' 2x3, 'b' 4x5)": what reaches a node, from a lenient inference run."""
    try:
        lenient = onnx.shape_inference.infer_shapes(model, strict_mode=False,
                                                    data_prop=data_prop)
    except Exception:
        return ""
    known = {v.name: _dims_of(v) for g in (lenient.graph.input, lenient.graph.value_info)
             for v in g if v.type.tensor_type.HasField("shape")}
    known.update((t.name, list(t.dims)) for t in model.graph.initializer)
    shapes = [f"{n!r} {_show(known[n])}" for n in node.input if n in known]
    return f" (inputs {', '.join(shapes)})" if shapes else ""


def _disagreement(recorded: onnx.ModelProto, inferred: onnx.ModelProto, e: Exception) -> str:
    """A warning naming the tensors whose recorded shape inference contradicted."""
    found = {v.name: _dims_of(v) for g in (inferred.graph.value_info, inferred.graph.output)
             for v in g}
    stale = []
    for v in (*recorded.graph.value_info, *recorded.graph.output):
        old, new = _dims_of(v), found.get(v.name)
        if new is not None and v.type.tensor_type.HasField("shape") and (
                len(old) != len(new) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                            for a, b in zip(old, new, strict=False))):
            stale.append(f"tensor {v.name!r} recorded as {_show(old)}, inferred {_show(new)}")
    if not stale:
        return f"onnx's shape inference disagreed with the model ({_first_line(e)}); retried"
    more = f" and {len(stale) - 1} more" if len(stale) > 1 else ""
    return f"shapes recorded in the model are stale: {stale[0]}{more}; inferred shapes used"


def _dims_of(v: onnx.ValueInfoProto) -> list[Dim]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in v.type.tensor_type.shape.dim]


def _first_line(e: Exception) -> str:
    return _first_line_of(str(e)) or type(e).__name__


def _first_line_of(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else ""


def _has_unknown(produced: Iterable[str], tensors: Mapping[str, TensorInfo]) -> bool:
    """Some node output has no type, an unknown rank or an unknown dim."""
    for name in produced:
        info = tensors.get(name)
        if info is None or info.shape is None or None in info.shape:
            return True
    return False


# com.microsoft ops whose output has input 0's shape, that ORT's symbolic shape inference
# (1.31) does not know: QOperator BERT's QLinearSoftmax left 32 nodes after it unknown.
_SAME_SHAPE_CONTRIB = ("QLinearSoftmax", "QLinearSigmoid", "QLinearLeakyRelu",
                       "QMoE")  # QMoE: the genai builder's int4 gpt-oss; output = input's shape


def _global_pool_shape(engine: Any, node: onnx.NodeProto) -> None:
    """QLinearGlobalAveragePool's output in ORT's symbolic inference: the input's shape with
    every spatial dim 1 (N, C, 1, 1; N, 1, 1, C with channels_last): the QOperator models
    of torchvision classifiers left it, the QGemm and the output after it without shapes."""
    dims = list(engine._get_shape(node, 0))
    last = any(a.name == "channels_last" and a.i for a in node.attribute)
    spatial = slice(1, -1) if last else slice(2, None)
    dims[spatial] = [1] * len(dims[spatial])
    elem_type = engine.known_vi_[node.input[0]].type.tensor_type.elem_type
    engine.known_vi_[node.output[0]].CopyFrom(
        onnx.helper.make_tensor_value_info(node.output[0], elem_type, dims))


def _gather_block_quantized_shape(engine: Any, node: onnx.NodeProto) -> None:
    """GatherBlockQuantized's output in ORT's symbolic inference: data's shape with the
    `gather_axis` replaced by the indices' shape, in the scales' type, the last axis unpacked
    (8 / bits values a byte) when data is uint8, MatMulNBits' packing. ORT's own rule (its
    Gather's) reads `axis` and leaves the bytes packed: an onnxruntime-genai int4 decoder with
    tied embeddings got [B, S, hidden / 2] and its inference stopped at the first MatMulNBits."""
    attrs = {a.name: a.i for a in node.attribute}
    data, indices = engine._get_shape(node, 0), engine._get_shape(node, 1)
    axis = attrs.get("gather_axis", 0) % len(data)
    dims = [*data[:axis], *indices, *data[axis + 1:]]
    if engine.known_vi_[node.input[0]].type.tensor_type.elem_type == onnx.TensorProto.UINT8:
        dims[-1] = dims[-1] * (8 // attrs.get("bits", 4))
    elem_type = engine.known_vi_[node.input[2]].type.tensor_type.elem_type
    engine.known_vi_[node.output[0]].CopyFrom(
        onnx.helper.make_tensor_value_info(node.output[0], elem_type, dims))


def _gqa_present_shape(engine: Any, infer: Callable[[onnx.NodeProto], None],
                       node: onnx.NodeProto) -> None:
    """GroupQueryAttention in ORT's symbolic inference (`infer`), with its present K / V
    [B, N_kv, past + S, D] where the past and the query's S new tokens are known numbers.
    ORT's rule gives present the past's shape, which holds only when the two share one buffer
    of the maximum length; run with separate buffers, as onnxlens feeds it and as the
    onnxruntime-genai export declares (`total_sequence_length`), ORT appends the new tokens:
    a decode step over a past of 511 returns 512 rows. A `sliding_window_cache` keeps its
    capacity: present is the past's shape, ORT's answer."""
    infer(node)
    if any(a.name == "sliding_window_cache" and a.i for a in node.attribute):
        return
    past, query = engine._try_get_shape(node, 3), engine._try_get_shape(node, 0)
    if len(node.output) < 3 or not past or len(past) != 4 or not query or len(query) != 3:
        return
    if not (isinstance(past[2], int) and isinstance(query[1], int)):
        return  # symbolic: ORT's answer stands
    present = [*past[:2], past[2] + query[1], past[3]]
    for name in node.output[1:3]:
        vi = engine.known_vi_[name]
        vi.CopyFrom(onnx.helper.make_tensor_value_info(
            name, vi.type.tensor_type.elem_type, present))


def _qgemm_shape(engine: Any, node: onnx.NodeProto) -> None:
    """QGemm's output in ORT's symbolic inference: [M, N] of A [M, K] (transA: [K, M]) and B
    (input 3) [K, N] (transB: [N, K]); quantized to y_zero_point's type (input 8; A's without
    one) when y_scale (input 7, after the bias) is given, else float. The QOperator
    classifiers' last layer."""
    attrs = {a.name: a.i for a in node.attribute}
    a, b = engine._get_shape(node, 0), engine._get_shape(node, 3)
    dims = [a[1] if attrs.get("transA") else a[0], b[0] if attrs.get("transB") else b[1]]
    given = [name for name in node.input[7:9] if name]
    elem_type = (engine.known_vi_[given[-1] if len(given) > 1 else node.input[0]]
                 .type.tensor_type.elem_type) if given else onnx.TensorProto.FLOAT
    engine.known_vi_[node.output[0]].CopyFrom(
        onnx.helper.make_tensor_value_info(node.output[0], elem_type, dims))


def _qlinear_concat_shape(inference: Any, engine: Any, node: onnx.NodeProto) -> None:
    """QLinearConcat's output, which ORT's symbolic inference lacks (it gave float, and a
    QOperator ViT's class-token concat made the QLinearAdd and DequantizeLinear after it read
    float against a uint8 zero point): the Concat of the quantized inputs (2, 5, 8, ...; each
    followed by its scale and zero point) along `axis`, in the output zero point's type
    (input 1)."""
    data = onnx.NodeProto()
    data.CopyFrom(node)
    del data.input[:]
    data.input.extend(node.input[2::3])
    shapes = [engine._get_sympy_shape(data, i) for i in range(len(data.input))]
    axis = inference.handle_negative_axis(
        next(a.i for a in node.attribute if a.name == "axis"), len(shapes[0]))
    dims = list(shapes[0])
    dims[axis] = sum(shape[axis] for shape in shapes)
    engine._update_computed_dims(dims)
    elem_type = engine.known_vi_[node.input[1]].type.tensor_type.elem_type
    engine.known_vi_[node.output[0]].CopyFrom(onnx.helper.make_tensor_value_info(
        node.output[0], elem_type, inference.get_shape_from_sympy_shape(dims)))


def _symbolic_inference(model: onnx.ModelProto, warnings: list[str]) -> onnx.ModelProto:
    """ONNX Runtime's symbolic shape inference fills what onnx's could not (needs sympy)."""
    try:
        inference = _ort_symbolic_shape_infer()
    except Exception as e:  # onnxruntime or sympy missing: keep onnx's answer
        warnings.append(f"ONNX Runtime's symbolic shape inference unavailable ({_first_line(e)})")
        return model
    if (inference.get_opset(model) or 0) < 7:
        return model
    # Its `infer_shapes` entry point saves the partial model to `sym_shape_infer_temp.onnx` (plus
    # external data) in the working directory when a shape stays unknown: never write outside
    # where we should. So drive its loop here; a partial answer may hold guessed ranks, so onnx's
    # answer stands then, as it did when `infer_shapes` raised.
    engine = inference.SymbolicShapeInference(2**31 - 1, True, True, 0)
    for op in _SAME_SHAPE_CONTRIB:  # contrib ops ORT's inference lacks
        engine.dispatcher_.setdefault(op, engine._pass_on_shape_and_type)
    engine.dispatcher_.setdefault("QLinearGlobalAveragePool", functools.partial(
        _global_pool_shape, engine))
    engine.dispatcher_.setdefault("QGemm", functools.partial(_qgemm_shape, engine))
    engine.dispatcher_.setdefault("QLinearConcat", functools.partial(
        _qlinear_concat_shape, inference, engine))
    engine.dispatcher_["GatherBlockQuantized"] = functools.partial(
        _gather_block_quantized_shape, engine)
    if "GroupQueryAttention" in engine.dispatcher_:
        engine.dispatcher_["GroupQueryAttention"] = functools.partial(
            _gqa_present_shape, engine, engine.dispatcher_["GroupQueryAttention"])
    try:
        engine._preprocess(model)
        complete = False
        while engine.run_:
            complete = engine._infer_impl()
        engine._update_output_from_vi()
    except Exception as e:  # its failures are many and unhelpful; onnx's partial answer stands
        node = _inferring(e)
        at = f" at node {node.name!r} ({node.op_type})" if node is not None else ""
        warnings.append(f"ONNX Runtime's symbolic shape inference gave up{at}: {_first_line(e)}")
        return model
    if not complete:
        warnings.append("ONNX Runtime's symbolic shape inference gave up: some shapes stay unknown")
        return model
    return engine.out_mp_


def _inferring(e: BaseException) -> onnx.NodeProto | None:
    """The node ORT's symbolic inference was at when it raised `e`: its messages do not say
    (shapes that do not broadcast fail with a bare AssertionError). Its loop,
    `SymbolicShapeInference._infer_impl`, holds the node in the local `node`; the innermost
    such frame (a subgraph's) is the one. None where the failure was outside the loop."""
    node = None
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_infer_impl":
            local = tb.tb_frame.f_locals.get("node")
            node = local if isinstance(local, onnx.NodeProto) else node
        tb = tb.tb_next
    return node


@functools.cache
def _ort_symbolic_shape_infer() -> ModuleType:
    """ORT's symbolic_shape_infer.py, loaded from its file.

    Importing it as ``onnxruntime.tools.symbolic_shape_infer`` would run
    ``onnxruntime/tools/__init__.py``, which imports torch when installed (seconds); the module
    itself needs only numpy, onnx, sympy and packaging.
    """
    ort = importlib.util.find_spec("onnxruntime")
    if ort is None or ort.origin is None:
        raise ModuleNotFoundError("onnxruntime is not installed")
    file = Path(ort.origin).parent / "tools" / "symbolic_shape_infer.py"
    spec = importlib.util.spec_from_file_location("onnxlens_ort_symbolic_shape_infer", file)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"{file} not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Its warnings ("unsafe merge", ...) would print to stderr: keep them quiet.
    logger = logging.getLogger(module.__name__)
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return module


# ---- the tensor table -------------------------------------------------------------------------


def _type_of(t: onnx.TypeProto, symbols: set[str]) -> tuple[int, Shape | None]:
    if not t.HasField("tensor_type"):
        return 0, None
    tensor_type = t.tensor_type
    if not tensor_type.HasField("shape"):
        return tensor_type.elem_type, None
    dims: list[Dim] = []
    for d in tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif isinstance(d.dim_param, str) and d.dim_param and all(  # bytes: not UTF-8
                name in symbols or name in _EXPRESSION_FUNCTIONS
                for name in _IDENTIFIER.findall(d.dim_param)):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    if dims and all(d is None for d in dims):
        return tensor_type.elem_type, None  # nothing known; the rank may be ORT's guess
    return tensor_type.elem_type, tuple(dims)


def _tensor_table(graph: onnx.GraphProto, weights: Mapping[str, TensorInfo],
                  symbols: set[str]) -> dict[str, TensorInfo]:
    table: dict[str, TensorInfo] = {}
    types: dict[bytes, tuple[int, Shape | None]] = {}  # most tensors share a few types
    for v in (*graph.value_info, *graph.input, *graph.output):
        name = v.name
        weight = weights.get(name)
        if weight is not None:  # its own type wins (the light copy declares most as inputs)
            table[name] = weight
            continue
        t = v.type
        key = t.SerializeToString()
        found = types.get(key)
        if found is None:
            found = types[key] = _type_of(t, symbols)
        table[name] = TensorInfo(name, *found)
    for name, weight in weights.items():
        if name not in table:
            table[name] = weight
    return table


def _check_sizes(tensors: Mapping[str, TensorInfo], max_tensor_bytes: int) -> None:
    seen: set[tuple[int, Shape]] = set()
    for t in tensors.values():
        if t.shape is not None and (t.elem_type, t.shape) not in seen:
            seen.add((t.elem_type, t.shape))
            _check_dims(f"tensor {t.name!r}", t.shape, t.elem_type, max_tensor_bytes)
