"""Fusion of four spellings Hugging Face models write in primitives, each exported from the
model's own code (transformers, random weights) by both torch exporters: CLIP's quick_gelu
(x·σ(1.702x)), Bloom's tanh GELU (√(2/π)·x·(1 + 0.044715·x·x), its own association),
Persimmon's / Nemotron's relu(x)² and GPT-J's interleaved rotary embedding (rotate_every_two:
stack(-x[..., 1::2], x[..., ::2]) flattened). Each is one group holding exactly the nodes the
source writes for it."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers.activations import QuickGELUActivation, ReLUSquaredActivation
from transformers.models.bloom.modeling_bloom import BloomGelu
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

import onnxlens
from onnxlens.analyzer.analysis import AnalysisResult
from onnxlens.analyzer.fusion import ROPE, Group
from onnxlens.analyzer.invariants import check_invariants

TOKENS = (1, 8, 16)


def _analyzed(module: nn.Module, args: tuple[torch.Tensor, ...], path: Path,
              dynamo: bool) -> AnalysisResult:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=dynamo, external_data=False,
                          **({} if dynamo else {"opset_version": 17}))
    result = onnxlens.analyze(path)
    assert check_invariants(result.graph, result.groups) == []
    return result


def _ops(result: AnalysisResult, group: Group) -> Counter[str]:
    """The group's ops, Constants aside (TorchScript writes its scalars as Constant nodes)."""
    ops = (result.graph.info(k).op_type for k in group.nodes)
    return Counter(o for o in ops if o != "Constant")


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize(("act", "name", "gate", "torchscript_gate"), [
    # x * sigmoid(1.702 * x)
    (QuickGELUActivation, "QuickGelu", {"Mul": 2, "Sigmoid": 1}, None),
    # (x * 0.5) * (1 + tanh((x * 0.79788456) * (1 + (x * 0.044715) * x)))
    (BloomGelu, "Gelu", {"Mul": 6, "Add": 2, "Tanh": 1}, None),
    # relu(x)²: dynamo writes Pow(r, 2), TorchScript Mul(r, r)
    (ReLUSquaredActivation, "SquaredRelu", {"Relu": 1, "Pow": 1}, {"Relu": 1, "Mul": 1})],
    ids=["clip-quick-gelu", "bloom-gelu", "persimmon-relu2"])
def test_linear_and_spelled_activation_are_one_group(
        act: type[nn.Module], name: str, gate: dict[str, int],
        torchscript_gate: dict[str, int] | None, dynamo: bool, tmp_path: Path) -> None:
    result = _analyzed(nn.Sequential(nn.Linear(16, 32), act()), (torch.randn(*TOKENS),),
                       tmp_path / "mlp.onnx", dynamo)
    (group,) = result.groups
    assert group.pattern == f"MatMul+Add+{name}"
    ops = gate if dynamo or torchscript_gate is None else torchscript_gate
    assert _ops(result, group) == Counter({"MatMul": 1, "Add": 1}) + Counter(ops)


class _GPTJRotary(nn.Module):
    """GPT-J's rotary step on q [1, S, heads, head size] with rotary_dim = head size."""

    def __init__(self, head_size: int, positions: int) -> None:
        super().__init__()
        self.register_buffer("table", create_sinusoidal_positions(positions, head_size))

    def forward(self, q: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        sin, cos = torch.split(self.table[position_ids], self.table.shape[-1] // 2, dim=-1)
        return apply_rotary_pos_emb(q, sin, cos)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_gptj_interleaved_rope_is_one_group(dynamo: bool, tmp_path: Path) -> None:
    q, positions = torch.randn(1, 8, 2, 16), torch.arange(8)[None]
    result = _analyzed(_GPTJRotary(16, 64), (q, positions), tmp_path / "rope.onnx", dynamo)
    (group,) = [g for g in result.groups if ROPE in g.pattern]
    # x·cos + rotate_every_two(x)·sin; rotate_every_two: two strided Slices, a Neg, each
    # unsqueezed for the stack (a Concat) and flattened back (a Reshape); TorchScript computes
    # the flattened shape as Concat(Slice(Shape(stack)), [-1])
    shape = Counter() if dynamo else Counter({"Shape": 1, "Slice": 1, "Concat": 1})
    assert _ops(result, group) == Counter({"Slice": 2, "Neg": 1, "Unsqueeze": 2, "Concat": 1,
                                           "Reshape": 1, "Mul": 2, "Add": 1}) + shape
