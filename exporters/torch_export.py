"""PyTorch modules to ONNX.

We use torch's TorchScript-based exporter (``dynamo=False``): its node names follow the module
tree (``/layer1/layer1.0/conv1/Conv``), which is what users type in ``--from``/``--to`` and
read in reports, and its output needs no clean-up of shape plumbing. With
``keep_batchnorm`` the model is exported with ``TrainingMode.PRESERVE`` and no constant
folding, so BatchNormalization nodes stay (in eval semantics); otherwise BatchNorm is folded
into the preceding Conv, as inference runtimes do.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import onnx

from ..analyzer.errors import ExportError

DEFAULT_OPSET = 17


def export_module(module: Any, example_inputs: tuple, out: str | Path, *,
                  keep_batchnorm: bool = False, opset: int | None = None,
                  dynamic_batch: bool = False, input_names: list[str] | None = None) -> Path:
    """Export `module` (put in eval mode) called on `example_inputs` to the file `out`."""
    import torch

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    module = module.eval()
    names = input_names or (["input"] if len(example_inputs) == 1
                            else [f"input_{i}" for i in range(len(example_inputs))])
    dynamic_axes = ({n: {0: "batch"} for n in [*names, "output"]} if dynamic_batch else None)
    training = (torch.onnx.TrainingMode.PRESERVE if keep_batchnorm
                else torch.onnx.TrainingMode.EVAL)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, example_inputs, str(out), dynamo=False,
                              opset_version=opset or DEFAULT_OPSET, input_names=names,
                              output_names=["output"], dynamic_axes=dynamic_axes,
                              training=training, do_constant_folding=not keep_batchnorm)
    except Exception as e:  # torch raises many types; the user needs the one line
        raise ExportError(f"torch.onnx.export failed for {type(module).__name__}: "
                          f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
                          ) from None
    model = onnx.load(str(out))
    _materialize_weight_identities(model)
    onnx.save(model, str(out))
    return out


def _materialize_weight_identities(model: onnx.ModelProto) -> None:
    """Turn each `Identity(initializer)` node into an initializer of its own.

    The TorchScript exporter stores parameters with equal values once (with random weights,
    every BatchNorm's running mean is zeros) and gives each other user an Identity of it.
    Those are distinct parameters of the module, not shared ones, and an Identity between a
    Conv and its weight is bookkeeping, not work: copy the data under the Identity's name.
    """
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    copies = [n for n in graph.node if n.op_type == "Identity" and n.input[0] in initializers
              and n.output[0] not in outputs]
    if not copies:
        return
    for node in copies:
        tensor = onnx.TensorProto()
        tensor.CopyFrom(initializers[node.input[0]])
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
    dropped = {id(n) for n in copies}
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
