"""Vision models from timm that torchvision lacks, as `module:factory` specs for the estimate
benchmarks (random weights, eval mode): conv/attention hybrids, channels-last norms and
re-parameterized blocks (in their deploy form, as they ship).

    python benchmarks/estimate_accuracy.py --threads 1 --models $(python benchmarks/timm_models.py)

`pip install -e ".[bench]"` brings timm (not a dependency of onnxlens itself).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

# name -> what it brings that torchvision's models do not
MODELS = {
    "repvgg_a0": "re-parameterized 3x3+1x1 branches",
    "mobileone_s0": "re-parameterized depthwise/pointwise branches",
    "fastvit_t8": "re-parameterized token mixer, conv/attention hybrid",
    "repghostnet_050": "re-parameterized ghost modules",
    "mobilevit_xxs": "conv/transformer hybrid (unfold to patches)",
    "efficientformer_l1": "pool mixers, then attention",
    "levit_128s": "conv stem, attention with bias, BatchNorm in linear layers",
    "tiny_vit_5m_224": "MBConv stages, then windowed attention",
    "edgenext_xx_small": "channels-last LayerNorm, split depthwise attention",
    "convnextv2_atto": "channels-last LayerNorm, global response norm",
    "ghostnet_100": "ghost modules, squeeze-excite",
    "rexnet_100": "SiLU/ReLU6 mix, squeeze-excite",
    "mobilenetv4_conv_small": "universal inverted bottleneck",
    "efficientvit_b0": "linear (ReLU) attention, hardswish",
}


def _build(name: str) -> object:
    import timm
    from timm.utils.model import reparameterize_model

    model = timm.create_model(name, pretrained=False, num_classes=1000).eval()
    return reparameterize_model(model)


def __getattr__(name: str) -> Callable[[], object]:
    """`timm_models:NAME` for every NAME of MODELS."""
    if name in MODELS:
        return functools.partial(_build, name)
    raise AttributeError(name)


if __name__ == "__main__":
    sys.stdout.write(" ".join(f"timm_models:{m}" for m in MODELS) + "\n")
