"""Our totals beside published figures: torchvision's (recorded by the exporter in the model's
metadata) and the seed reports' claims about ResNet-18, each with why they differ."""

from __future__ import annotations

from typing import Any

# Seed 000 (ResNet-18 characterization report), at 1x3x224x224. Each: figure, claim, the total
# of ours it is set beside, and why they differ.
_SEED_RESNET18 = (
    ("FLOPs of Conv + FC (\"theoretical\")", 3.59e9, "mac_flops",
     "the seed's layer table leaves out the three 1x1 downsample convolutions "
     "(3 x 12.85 MFLOPs); with them the total is exactly 2 x the Conv+Gemm MACs"),
    ("fused Conv tiles", 17, "conv_groups",
     "17 is the number of ReLUs; ResNet-18 has 20 convolutions: 9 Conv+BN+ReLU, "
     "8 Conv+BN+Add+ReLU (residual) and 3 Conv+BN (downsample)"),
)


def references(d: dict[str, Any]) -> list[dict[str, Any]]:
    meta = d["model"].get("metadata") or {}
    totals = d["totals"]
    rows: list[dict[str, Any]] = []
    gmacs, params = _number(meta, "torchvision.gmacs"), _number(meta, "torchvision.num_params")
    if gmacs is not None:
        rows.append(_row("MACs", totals["macs"], gmacs * 1e9, "torchvision weights meta _ops",
                         "rounded to 0.001 G"))
    if params is not None:
        rows.append(_row("parameters", totals["params"], params,
                         "torchvision weights meta num_params",
                         "ours counts initializers: BatchNorm folded (one bias per conv channel "
                         "instead of gamma and beta), or kept with its running statistics"))
    inputs = d["model"]["inputs"]
    if (meta.get("onnxlens.source") == "torchvision:resnet18" and inputs
            and inputs[0]["shape"] == [1, 3, 224, 224]):
        ours = {"mac_flops": 2 * totals["macs"],
                "conv_groups": sum(1 for g in d["groups"] if g["pattern"].startswith("Conv"))}
        for figure, claim, key, why in _SEED_RESNET18:
            rows.append(_row(figure, ours[key], claim, "seed report 000 (ResNet-18)", why))
    return rows


def _number(meta: dict[str, str], key: str) -> float | None:
    """A published figure from model metadata: anyone can write metadata, so check it."""
    try:
        value = float(meta[key])
    except (KeyError, ValueError, TypeError):
        return None
    return value if value > 0 and value < 1e18 else None


def _row(figure: str, ours: float, published: float, source: str, why: str) -> dict[str, Any]:
    ratio = ours / published if published else None
    return {"figure": figure, "ours": ours, "reference": published, "source": source,
            "ratio": ratio, "verdict": why}
