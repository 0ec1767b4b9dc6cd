"""Fusion of transformer graphs: tiny GPT-2, BERT and GQA Llama (2 layers, hidden 64, seq 16,
random weights) exported by both torch exporters, and BERT rewritten by ORT's transformer
optimizer. Each layer is one attention group, its norms are norm groups, Llama's MLP one
SwiGLU; the mask construction is one group of its own, not a layer; every node is in one
group (the invariants) and the groups' costs add up to the model's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from hf_models import export

import onnxlens
from onnxlens.analyzer.analysis import AnalysisResult
from onnxlens.analyzer.fusion import ATTENTION, MASK, NORMS, ROPE, SWIGLU
from onnxlens.analyzer.invariants import check_graph, check_groups

LAYERS, HIDDEN, SEQ = 2, 64, 16


@pytest.fixture(scope="module", params=[(m, d) for m in ("gpt2", "bert", "llama")
                                        for d in (True, False)],
                ids=lambda p: f"{p[0]}-{'dynamo' if p[1] else 'torchscript'}")
def analyzed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, AnalysisResult]:
    name, dynamo = request.param
    path = export(name, tmp_path_factory.mktemp(name) / "model.onnx", layers=LAYERS,
                  hidden=HIDDEN, seq=SEQ, dynamo=dynamo)
    return name, onnxlens.analyze(path)


def _count(result: AnalysisResult, pick: object) -> int:
    return sum(1 for g in result.groups if pick(g.pattern))  # type: ignore[operator]


def test_one_attention_group_per_layer(analyzed: tuple[str, AnalysisResult]) -> None:
    _, result = analyzed
    check_graph(result.graph)
    check_groups(result.graph, result.groups)
    assert _count(result, lambda p: ATTENTION in p) == LAYERS
    assert _count(result, lambda p: p == MASK) == 1  # shared by the layers, not one of them
    ops = Counter(result.graph.info(k).op_type for g in result.groups if g.pattern == ATTENTION
                  for k in g.nodes)
    assert ops["Softmax"] == LAYERS and ops["MatMul"] == 2 * LAYERS


def test_norm_swiglu_and_rope_groups(analyzed: tuple[str, AnalysisResult]) -> None:
    name, result = analyzed
    # Two norms a layer, and one more: the final norm (GPT-2, Llama) or the embeddings' (BERT).
    assert _count(result, lambda p: p in NORMS) == 2 * LAYERS + 1
    assert _count(result, lambda p: p == SWIGLU) == (LAYERS if name == "llama" else 0)
    assert _count(result, lambda p: p == ROPE) == (2 * LAYERS if name == "llama" else 0)
    # GQA (Llama): each layer's K and V head expansion is inside its attention group.
    inside = Counter(result.graph.info(k).op_type for g in result.groups
                     if g.pattern == ATTENTION for k in g.nodes)
    assert inside["Expand"] == (2 * LAYERS if name == "llama" else 0)


def test_group_costs_add_up_to_the_model(analyzed: tuple[str, AnalysisResult]) -> None:
    _, result = analyzed
    groups = [nc.cost for nc in result.group_costs.values()]
    nodes = [nc.cost for nc in result.node_costs.values()]
    assert None not in groups and None not in nodes
    for kind in ("macs", "other_flops", "transcendental"):
        assert sum(getattr(c, kind) for c in groups) == sum(getattr(c, kind) for c in nodes)
    assert sum(c.macs for c in groups) == result.total.macs > 0


def test_ort_transformer_optimizer_output(tmp_path: Path) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    path = export("bert", tmp_path / "bert.onnx", layers=LAYERS, hidden=HIDDEN, seq=SEQ,
                  dynamo=False)
    optimize_model(str(path), model_type="bert", num_heads=HIDDEN // 16,
                   hidden_size=HIDDEN).save_model_to_file(str(tmp_path / "opt.onnx"))
    result = onnxlens.analyze(tmp_path / "opt.onnx")
    check_groups(result.graph, result.groups)
    patterns = Counter(g.pattern for g in result.groups)
    assert sum(n for p, n in patterns.items() if ATTENTION in p) == LAYERS, patterns
    assert sum(n for p, n in patterns.items() if "LayerNorm" in p) == 2 * LAYERS + 1, patterns


def assert_one_attention_per_layer(result: AnalysisResult, outside: str,
                                   product: str = "MatMul") -> None:
    """LAYERS attention groups, each Q·Kᵀ, softmax and P·V (2·S²·H MACs, hand count; the two
    products `product` nodes), none holding an `outside` node of the position bias's
    computation."""
    check_groups(result.graph, result.groups)
    attention = [g for g in result.groups if ATTENTION in g.pattern]
    assert len(attention) == LAYERS
    for group in attention:
        ops = Counter(result.graph.info(k).op_type for k in group.nodes)
        assert ops["Softmax"] == 1 and ops[product] == 2 and ops[outside] == 0
        assert result.group_costs[group.id].cost.macs == 2 * SEQ * SEQ * HIDDEN


@pytest.mark.parametrize(("dynamo", "ort_optimized"), [(True, False), (False, False),
                                                       (False, True)],
                         ids=["dynamo", "torchscript", "torchscript-ort-optimizer"])
def test_deberta_disentangled_attention(tmp_path: Path, dynamo: bool,
                                        ort_optimized: bool) -> None:
    """HF DeBERTa-v2 masks with masked_fill (Where(~mask, min, scores + relative bias), the
    scores in a 4-D view of a 3-D bmm; ORT's optimizer rewrites it Where(mask, scores, min))
    and scales kᵀ by a Div: one attention group a layer, which holds Q·Kᵀ and P·V (2·S²·H
    MACs, hand count) and not the per-layer relative-position bias (c2p and p2c: S x 2k
    matmuls and GatherElements) that it adds."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.DebertaV2Model(transformers.DebertaV2Config(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HIDDEN // 16,
        intermediate_size=2 * HIDDEN, vocab_size=64, max_position_embeddings=64,
        relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"])).eval()
    ids = torch.randint(0, 64, (1, SEQ))
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    path = tmp_path / "deberta.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), str(path), dynamo=dynamo,
                          input_names=["input_ids", "attention_mask"], **(
                              {"external_data": False} if dynamo else {}))
    if ort_optimized:
        from onnxruntime.transformers.optimizer import optimize_model

        optimize_model(str(path), model_type="bert", num_heads=HIDDEN // 16,
                       hidden_size=HIDDEN).save_model_to_file(str(path))
    assert_one_attention_per_layer(onnxlens.analyze(path), outside="GatherElements")


def test_mpnet_relative_position_bias(tmp_path: Path) -> None:
    """HF MPNet adds its relative position bias to the scaled scores, then the mask: one
    attention group a layer, Q·Kᵀ and P·V (2·S²·H MACs, hand count), the bias's bucketing
    (Log, Where, ...) outside it."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.MPNetModel(transformers.MPNetConfig(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HIDDEN // 16,
        intermediate_size=2 * HIDDEN, vocab_size=64, max_position_embeddings=64)).eval()
    path = tmp_path / "mpnet.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (torch.randint(0, 64, (1, SEQ)),
                                  torch.ones(1, SEQ, dtype=torch.int64)), str(path),
                          dynamo=False, input_names=["input_ids", "attention_mask"])
    assert_one_attention_per_layer(onnxlens.analyze(path), outside="Log")


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_funnel_einsum_attention(tmp_path: Path, dynamo: bool) -> None:
    """HF Funnel writes attention with Einsums ('bind,bjnd->bnij', 'bnij,bjnd->bind'), adds
    its relative positional and token-type terms to the scores and subtracts the mask (in
    TorchScript between two Casts): one attention group a layer (one block of one layer, one
    decoder layer), Q·Kᵀ and P·V (2·S²·H MACs, hand count), the positional Einsums outside."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.FunnelModel(transformers.FunnelConfig(
        d_model=HIDDEN, n_head=HIDDEN // 16, d_head=16, d_inner=2 * HIDDEN, block_sizes=[1],
        num_decoder_layers=LAYERS - 1, vocab_size=64)).eval()
    path = tmp_path / "funnel.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (torch.randint(0, 64, (1, SEQ)),
                                  torch.ones(1, SEQ, dtype=torch.int64)), str(path),
                          dynamo=dynamo, input_names=["input_ids", "attention_mask"], **(
                              {"external_data": False} if dynamo else {}))
    result = onnxlens.analyze(path)
    assert_one_attention_per_layer(result, outside="Pad", product="Einsum")
    positional = [k for k in result.graph.order if result.graph.info(k).op_type == "Einsum"
                  and not any(k in g.nodes for g in result.groups if ATTENTION in g.pattern)]
    assert positional  # the position terms' Einsums stay outside
