"""PyTorch modules to ONNX: torchvision classification models by name, `module:factory` callables.

We use torch's TorchScript-based exporter (``dynamo=False``): its node names follow the module
tree (``/layer1/layer1.0/conv1/Conv``), which is what users type in ``--from``/``--to`` and
read in reports. The model is exported in eval semantics with constant folding; the shape
arithmetic that the exporter leaves in the graph is then folded wherever the shapes are static
(`_fold_static_shapes`), so that every tensor's shape, and so every cost, is known.
By default BatchNorm is folded into the preceding Conv (``TrainingMode.EVAL``), as inference
runtimes do; with ``keep_batchnorm`` the mode is ``TrainingMode.PRESERVE`` on a module in eval
mode, which keeps BatchNormalization nodes (eval semantics) and folds everything else the
same way, so the two exports differ only in BN.

Parameter counts are honest: the exporter's initializer de-duplication is switched off (see
`_export_graph`), so every parameter and buffer the graph reads is an initializer of its own.

torch and torchvision are imported inside the functions that need them: `cached_export` on a
cache hit, and everything that `analyze x.onnx` imports, must not pay for them.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from ..analyzer.errors import ExportError
from ..analyzer.fold import fold_nodes

if TYPE_CHECKING:
    import torch

DEFAULT_OPSET = 17
DEFAULT_IMAGE_SIZE = 224  # for module:factory specs and models whose weights name no crop size
CACHE_FORMAT = 3  # bump when a change here changes what an export of the same spec contains
# Random weights, but the same ones every time: the torch backend rebuilds the module and must
# get the weights the cached export holds.
WEIGHT_SEED = 0
# Protobuf refuses messages of 2 GiB; above this many bytes of weights they go to a side file.
EXTERNAL_DATA_BYTES = 1_800_000_000

# Builders that size their position embeddings (or partitions) from a constructor argument
# instead of from the input: without it they refuse any image side but 224.
_SIZE_KWARG = {"vit_": "image_size", "maxvit_": "input_size"}
# The auxiliary classifiers of these exist only for training (eval forward never runs them,
# and torchvision drops them when it loads weights), so build the inference network.
_AUX_LOGITS = ("googlenet", "inception_v3")


def export_module(module: torch.nn.Module, example_inputs: tuple, out: str | Path, *,
                  keep_batchnorm: bool = False, opset: int | None = None,
                  dynamic_batch: bool = False, input_names: Sequence[str] | None = None,
                  output_names: Sequence[str] | None = None,
                  metadata: Mapping[str, str] | None = None) -> Path:
    """Export `module` (put in eval mode) called on `example_inputs` to the file `out`.

    The file is written atomically (a temporary file renamed into place). Without
    `output_names`, the module is run once to name its outputs (``output``, or ``output_0``,
    ``output_1``... when it returns a tuple, list, namedtuple or dict of tensors).
    `dynamic_batch` makes dim 0 of every input and output the symbol ``batch``.
    """
    import torch

    out = Path(out)
    module = module.eval()
    names = list(input_names or (["input"] if len(example_inputs) == 1
                                 else [f"input_{i}" for i in range(len(example_inputs))]))
    try:
        if output_names is None:
            with torch.no_grad(), _no_mha_fastpath():
                n_out = _count_tensors(module(*example_inputs))
            output_names = ["output"] if n_out == 1 else [f"output_{i}" for i in range(n_out)]
        outputs = list(output_names)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
            raw = Path(tmp) / out.name
            _export_graph(module, example_inputs, raw, keep_batchnorm=keep_batchnorm,
                          opset=opset or DEFAULT_OPSET, input_names=names,
                          output_names=outputs, dynamic_batch=dynamic_batch)
            model = onnx.load(str(raw))
            _drop_initializer_inputs(model)
            _fold_static_shapes(model)
            for key, value in (metadata or {}).items():
                model.metadata_props.add(key=key, value=value)
            _save_atomic(model, out)
    except ExportError:
        raise
    except Exception as e:  # torch raises many types; the user needs the one line
        raise ExportError(f"exporting {type(module).__name__} to ONNX failed: "
                          f"{_first_line(e)}") from None
    return out


def _export_graph(module: torch.nn.Module, example_inputs: tuple, out: Path, *,
                  keep_batchnorm: bool, opset: int, input_names: list[str],
                  output_names: list[str], dynamic_batch: bool) -> None:
    """`torch.onnx.export` with the options that keep costs and parameter counts honest.

    ``keep_initializers_as_inputs=True`` is what switches off the exporter's de-duplication
    of initializers: in eval mode it merges parameters and buffers with *equal values* (with
    random weights every BatchNorm's running mean is zeros and its gamma ones, and every
    folded Conv bias is zeros) into one initializer plus an Identity per other user. Counted
    that way ResNet-18 has 11,680,872 elements folded and 11,681,832 with BN kept instead of
    11,684,712 and 11,699,112. Tied parameters (one tensor used twice) stay one initializer.
    The initializers are then removed from the graph inputs (`_drop_initializer_inputs`).
    """
    import torch

    training = (torch.onnx.TrainingMode.PRESERVE if keep_batchnorm
                else torch.onnx.TrainingMode.EVAL)
    dynamic_axes = ({n: {0: "batch"} for n in [*input_names, *output_names]}
                    if dynamic_batch else None)
    with (warnings.catch_warnings(), torch.no_grad(), _no_mha_fastpath(),
          _positional_forward(module)):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example_inputs, str(out), dynamo=False,
                          opset_version=opset, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes,
                          training=training, do_constant_folding=True,
                          keep_initializers_as_inputs=True)


@contextlib.contextmanager
def _no_mha_fastpath() -> Iterator[None]:
    """Without grad, nn.MultiheadAttention in eval runs one fused kernel,
    ``aten::_native_multi_head_attention``, that no ONNX exporter can translate (ViT's export
    fails on it). Switched off, attention is traced as the MatMul/Softmax ops it is made of.
    """
    import torch

    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


@contextlib.contextmanager
def _positional_forward(module: torch.nn.Module) -> Iterator[None]:
    """Hide the defaults of `module.forward`'s optional parameters from the exporter.

    The TorchScript exporter appends every defaulted parameter of ``forward`` to the example
    inputs and traces it as an input, so a ``bool`` default arrives as a Tensor:
    ``nn.TransformerEncoderLayer`` then fails with "scaled_dot_product_attention(): argument
    'is_causal' must be bool, not Tensor". A ``forward(*inputs)`` set on the instance for
    the export keeps the defaults Python values; the module tree, and so every name, is
    unchanged.
    """
    had_own = "forward" in module.__dict__
    bound = module.forward

    def forward(*inputs: Any) -> Any:
        return bound(*inputs)

    module.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had_own:
            module.forward = bound  # type: ignore[method-assign]
        else:
            del module.forward


def _drop_initializer_inputs(model: onnx.ModelProto) -> None:
    """Graph inputs are what the caller feeds; an initializer listed there is a weight."""
    weights = {t.name for t in model.graph.initializer}
    kept = [i for i in model.graph.input if i.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(kept)


FOLD_MAX_ELEMENTS = 1024  # shape plumbing is tiny; anything bigger is left to the runtime


def _fold_static_shapes(model: onnx.ModelProto, max_rounds: int = 100) -> None:
    """Fold `Shape` of tensors whose shape is static, and what follows, into Constant nodes.

    The TorchScript exporter records every ``x.shape[i]`` as runtime shape arithmetic
    (Swin-T: 472 Shape nodes, 2,600 Constants, 6,100 nodes in all); onnx's shape inference
    cannot see through most of it (Mod, Where, Range, ScatterND), so the shapes of Pad,
    Reshape and Expand outputs, and the costs after them, would stay unknown. With the input
    shape fixed these values are constants; with ``dynamic_batch`` only the shapes that do
    not involve the batch dim fold. Each round may reveal more static shapes.
    """
    for _ in range(max_rounds):
        if not _fold_constants(model, _static_shapes(model)):
            return


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Fully known shapes of the graph's tensors, from onnx's shape inference.

    Inference runs on a copy in which big initializers are graph inputs of the same type, so
    that it neither copies the weights nor meets the 2 GiB protobuf limit.
    """
    graph = model.graph
    light = onnx.helper.make_graph(list(graph.node), graph.name, list(graph.input),
                                   list(graph.output), value_info=list(graph.value_info))
    for t in graph.initializer:
        if int(np.prod(t.dims)) <= FOLD_MAX_ELEMENTS:
            light.initializer.append(t)
        else:
            light.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    probe = onnx.helper.make_model(light, opset_imports=list(model.opset_import),
                                   ir_version=model.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, data_prop=True).graph
    except Exception:  # inference rejects the graph: fold nothing, the loader will say why
        return {}
    shapes: dict[str, list[int]] = {t.name: list(t.dims) for t in graph.initializer}
    for vi in [*inferred.input, *inferred.value_info, *inferred.output]:
        tensor_type = vi.type.tensor_type
        if tensor_type.HasField("shape") and all(d.HasField("dim_value")
                                                 for d in tensor_type.shape.dim):
            shapes[vi.name] = [d.dim_value for d in tensor_type.shape.dim]
    return shapes


def _fold_constants(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> bool:
    """Replace the nodes computed only from Constant nodes and static shapes, when small, by
    Constant nodes (`analyzer.fold.fold_nodes`); whether the graph changed.

    torch's constant folding folds what reads initializers but leaves chains built from
    Constant nodes, such as the ``ConstantOfShape -> Mul -> Equal -> Where`` that spells
    ``expand(n, -1, -1)`` (ViT's class token). Left there, the Expand's output shape is
    unknown to onnx's shape inference and so is the cost of everything after it. Folding
    them with onnx's reference evaluator gives the shapes, as onnx-simplifier would.
    """
    from onnx import helper, numpy_helper

    opsets = {o.domain: o.version for o in model.opset_import}
    values: dict[str, np.ndarray] = {}
    fold_nodes(model.graph.node, values, opsets, dims=shapes.get,
               max_elements=FOLD_MAX_ELEMENTS)
    nodes: list[onnx.NodeProto] = []
    folded_any = False
    for node in model.graph.node:
        if node.op_type == "Constant" or not all(o in values for o in node.output if o):
            nodes.append(node)
            continue
        folded_any = True
        for i, name in enumerate(node.output):
            if name:
                nodes.append(helper.make_node(
                    "Constant", [], [name], name=node.name + (f"_{i}" if i else ""),
                    value=numpy_helper.from_array(values[name], name)))
    # Drop what no longer feeds anything (ONNX ops have no side effects): the Constants that
    # fed folded nodes, and tensors computed only for their (now constant) shape.
    used = {o.name for o in model.graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(nodes):
        if any(o in used for o in node.output):
            kept.append(node)
            used.update(node.input)
    changed = folded_any or len(kept) != len(nodes)
    del model.graph.node[:]
    model.graph.node.extend(reversed(kept))
    return changed


def _save_atomic(model: onnx.ModelProto, out: Path) -> None:
    """Write `out` (and `out.name + ".data"` for weights over 2 GiB) via a rename."""
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        staged = Path(tmp) / out.name
        if weight_bytes > EXTERNAL_DATA_BYTES:
            data = f"{out.name}.data"
            onnx.save_model(model, str(staged), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=data, size_threshold=0)
            os.replace(staged.with_name(data), out.with_name(data))
        else:
            onnx.save_model(model, str(staged))
        os.replace(staged, out)


def _count_tensors(value: Any) -> int:
    """Tensors in a forward's result, as the exporter flattens it."""
    import torch

    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(_count_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_count_tensors(v) for v in value)
    return 0


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ---- models by name ------------------------------------------------------------------------

def torchvision_names() -> list[str]:
    """Every torchvision classification model name (`resnet18`, `vit_b_16`, ...)."""
    import torchvision

    return list(torchvision.models.list_models(module=torchvision.models))


def default_image_size(name: str) -> int:
    """The crop size of a torchvision model's DEFAULT weights (read from metadata offline)."""
    import torchvision

    try:
        weights = torchvision.models.get_model_weights(name).DEFAULT
    except (ValueError, AttributeError):
        return DEFAULT_IMAGE_SIZE
    crop = getattr(weights.transforms, "keywords", {}).get("crop_size", DEFAULT_IMAGE_SIZE)
    return int(crop[0] if isinstance(crop, (list, tuple)) else crop)


def resolve_name(spec: str) -> str:
    """The torchvision name `spec` means (case-insensitive), or an ExportError suggesting some."""
    names = torchvision_names()
    if spec in names:
        return spec
    by_lower = {n.lower(): n for n in names}
    if spec.lower() in by_lower:
        return by_lower[spec.lower()]
    close = difflib.get_close_matches(spec.lower(), list(by_lower), n=3, cutoff=0.6)
    hint = (f"did you mean {', '.join(by_lower[c] for c in close)}?" if close
            else "`python -c \"import torchvision; print(torchvision.models.list_models("
                 "module=torchvision.models))\"` lists them")
    raise ExportError(f"unknown model {spec!r}: not a torchvision classification model nor "
                      f"module:factory; {hint}")


def build_module(spec: str, image_size: int | None = None) -> torch.nn.Module:
    """The module `spec` names, with the same seeded random weights as its export."""
    return build_model(spec, image_size)[0]


def build_model(spec: str, image_size: int | None = None) -> tuple[torch.nn.Module, int]:
    """The module `spec` names (random weights from `WEIGHT_SEED`) and the image side to export
    it at."""
    import torch

    torch.manual_seed(WEIGHT_SEED)
    if ":" in spec:
        module = _call_factory(spec)
        return module, image_size or DEFAULT_IMAGE_SIZE
    import torchvision

    name = resolve_name(spec)
    size = image_size or default_image_size(name)
    kwargs: dict[str, Any] = {}
    for prefix, key in _SIZE_KWARG.items():
        if name.startswith(prefix):
            kwargs[key] = size if key == "image_size" else (size, size)
    if name in _AUX_LOGITS:
        kwargs.update(aux_logits=False, init_weights=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = torchvision.models.get_model(name, weights=None, **kwargs)
    except Exception as e:  # e.g. an image side the architecture cannot take
        raise ExportError(f"cannot build {name} at image size {size}: {_first_line(e)}"
                          ) from None
    return module, size


def _call_factory(spec: str) -> torch.nn.Module:
    import torch

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ExportError(f"bad model spec {spec!r}: expected module:factory")
    try:
        factory = importlib.import_module(module_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
    except (ImportError, AttributeError) as e:
        raise ExportError(f"cannot load {spec!r}: {_first_line(e)}") from None
    if not callable(factory):
        raise ExportError(f"{spec!r} is not callable")
    try:
        module = factory()
    except Exception as e:  # arbitrary user code
        raise ExportError(f"{spec}() failed: {_first_line(e)}") from None
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"{spec}() returned {type(module).__name__}, not a torch.nn.Module")
    return module


def export_model(spec: str, out: str | Path, *, batch: int = 1, image_size: int | None = None,
                 keep_batchnorm: bool = False, opset: int | None = None,
                 dynamic_batch: bool = False) -> Path:
    """Export a torchvision model name or `module:factory` (random weights) to the file `out`.

    The input is ``input`` of shape ``batch x 3 x S x S`` where S is `image_size` or, by
    default, the crop size of the model's DEFAULT weights (224 for module:factory).
    """
    import torch

    if batch < 1:
        raise ExportError(f"batch must be at least 1, got {batch}")
    if image_size is not None and image_size < 1:
        raise ExportError(f"image size must be at least 1, got {image_size}")
    module, size = build_model(spec, image_size)
    example = (torch.randn(batch, 3, size, size),)
    try:
        return export_module(module, example, out, keep_batchnorm=keep_batchnorm, opset=opset,
                             dynamic_batch=dynamic_batch,
                             output_names=None if ":" in spec else ["output"],
                             metadata=_provenance(spec, size))
    except ExportError as e:
        if ":" not in spec:  # a torchvision or timm model: made for an image
            raise
        # A module:factory of a model with other inputs (a transformer's token ids) fails
        # somewhere inside its forward; say what it was fed and what to do instead.
        raise ExportError(f"{e} (onnxlens calls it on one float32 image [{batch}, 3, {size}, "
                          f"{size}]; export a model with other inputs with torch.onnx.export "
                          f"and analyze the .onnx)") from None


def _provenance(spec: str, size: int) -> dict[str, str]:
    """Where the model came from, and torchvision's published figures for it (read offline
    from the weights' metadata) when they apply: its MACs are for the default crop size."""
    if ":" in spec:
        return {"onnxlens.source": spec, "onnxlens.image_size": str(size)}
    import torchvision

    name = resolve_name(spec)
    out = {"onnxlens.source": f"torchvision:{name}", "onnxlens.image_size": str(size)}
    try:
        meta = torchvision.models.get_model_weights(name).DEFAULT.meta
    except (ValueError, AttributeError):
        return out
    if "num_params" in meta:
        out["torchvision.num_params"] = str(meta["num_params"])
    if "_ops" in meta and size == default_image_size(name):
        out["torchvision.gmacs"] = str(meta["_ops"])
    return out


# ---- the cache -----------------------------------------------------------------------------

def cache_dir() -> Path:
    """``$ONNXLENS_CACHE``, else ``$XDG_CACHE_HOME/onnxlens``, else ``~/.cache/onnxlens``."""
    if os.environ.get("ONNXLENS_CACHE"):
        return Path(os.environ["ONNXLENS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "onnxlens"


def cache_path(spec: str, *, batch: int, image_size: int | None, keep_batchnorm: bool,
               opset: int | None) -> Path:
    """Where `cached_export` keeps the export of `spec` with these options.

    The name carries every option and the torch/torchvision versions (the export differs
    between them); a module:factory spec also carries a hash of its source file, so editing
    the factory exports again. No torch import: a cache hit stays fast.
    """
    key = spec if ":" in spec else spec.lower()
    parts = [key, f"b{batch}", f"s{image_size}" if image_size else "sdefault",
             "bn" if keep_batchnorm else "bnfolded", f"op{opset or DEFAULT_OPSET}",
             f"torch{_version('torch')}", f"tv{_version('torchvision')}", f"v{CACHE_FORMAT}"]
    if ":" in spec:
        parts.append(_source_hash(spec.partition(":")[0]))
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(parts))
    return cache_dir() / f"{name}.onnx"


def cached_export(spec: str, *, batch: int = 1, image_size: int | None = None,
                  keep_batchnorm: bool = False, opset: int | None = None) -> Path:
    """Export `spec` once into the user cache and return the file; later calls reuse it."""
    path = cache_path(spec, batch=batch, image_size=image_size,
                      keep_batchnorm=keep_batchnorm, opset=opset)
    if path.is_file():
        return path
    what = "module:factory" if ":" in spec else "random weights"
    print(f"exporting {spec} ({what}) to {path} ...", file=sys.stderr, flush=True)
    return export_model(spec, path, batch=batch, image_size=image_size,
                        keep_batchnorm=keep_batchnorm, opset=opset)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _source_hash(module_name: str) -> str:
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec else None
    if not origin or not os.path.isfile(origin):
        return "nosrc"
    return hashlib.sha256(Path(origin).read_bytes()).hexdigest()[:12]
