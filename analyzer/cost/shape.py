"""Shape and data movement: views, copies, gathers, pads, constants, resizes. No arithmetic.

Views change only metadata and move no data on any real backend (no bytes charged); the
others copy or write elements (bytes charged by the analysis) but do 0 FLOPs. Resize and
Upsample interpolate and are the one exception.
"""

from __future__ import annotations

from ..ir import NodeInfo
from .base import NCHWC_DOMAIN, ZERO, Cost, register
from .ops import SHAPE, VIEWS


@register(*VIEWS, family=SHAPE, is_view=True)
def view(node: NodeInfo) -> Cost:
    # Metadata only: a new shape over the same buffer, or a shape/size read off it; Dropout at
    # inference is the identity (its optional mask output is all ones).
    # approximation: Dropout with training_mode=True (random masking) is costed as inference.
    return ZERO


@register("Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND",
          "Scatter", "ScatterElements", "ScatterND", "Expand", "Tile", "Pad", "Constant",
          "ConstantOfShape", "Range", "NonZero", "DepthToSpace", "SpaceToDepth", "Trilu",
          "OneHot", "EyeLike", "ReverseSequence", "Compress", "CenterCropPad", family="shape")
def data_movement(node: NodeInfo) -> Cost:
    # Copies, gathers, scatters, masked copies, fills and index generation: no arithmetic on
    # the data.
    return ZERO


# ORT's NCHWc layout changes, as its NchwcTransformer writes them into an optimized model
# (and the calibration times them alone): a copy of the input into the output, the NCHWc side
# padded to whole channel blocks, which the tensors' bytes count.
@register("ReorderInput", "ReorderOutput", family="shape", domain=NCHWC_DOMAIN)
def reorder(node: NodeInfo) -> Cost:
    return ZERO


@register("Resize", "Upsample", family="shape")
def resize(node: NodeInfo) -> Cost:
    x, y = node.inputs[0], node.outputs[0]
    d = sum(a != b for a, b in zip(x.dims, y.dims, strict=True))
    mode = node.attr("mode", "nearest")
    if mode == "nearest" or d == 0:
        return ZERO  # a gather, or a copy
    # d axes change size; each output is a weighted sum over a stencil of 2^d (linear) or 4^d
    # (cubic) inputs: taps multiplies and taps - 1 adds.
    # approximation: coordinate transforms and tap weights, computed once per axis index, are
    # not counted; antialias (wider stencils when downscaling) is counted as without.
    taps = (4 if mode == "cubic" else 2) ** d
    return Cost(other_flops=(2 * taps - 1) * y.size)
