"""LLM decoders as onnxruntime-genai's model builder writes them (tests/data/genai, made by
tests/data/genai/make.py from a random-weights Llama: 2 layers, hidden 32, 2 query heads and 1
KV head of 16, MLP 64, vocabulary 64): GroupQueryAttention with a KV cache, MatMulNBits int4,
SkipSimplifiedLayerNormalization, and SimplifiedLayerNormalization in the default domain, which
onnx's checker does not know.

MACs of one step of s new tokens over a cache of p, by hand (per layer: the packed qkv
projection 32 x (2+1+1)·16, o 32 x 32, gate and up 32 x 64, down 64 x 32; lm_head 32 x 64;
attention QK^T and PV over the p + s keys, 2 heads of 16):

    MACs = s · (2 · (2048 + 1024 + 2·2048 + 2048) + 2048) + 2 · 2 · 2 · s · (p + s) · 16
         = 20480 · s + 128 · s · (p + s)
"""

from __future__ import annotations

from pathlib import Path

import pytest

import onnxlens
from onnxlens.analyzer.hardware import load_profile

DATA = Path(__file__).parent / "data" / "genai"


def _dims(s: int, p: int) -> dict[str, int]:
    return {"batch_size": 1, "sequence_length": s, "past_sequence_length": p,
            "total_sequence_length": p + s, "kv_cache_dim": 16}


def _macs(s: int, p: int) -> int:
    return 20480 * s + 128 * s * (p + s)


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize(("s", "p"), [(4, 0), (1, 7)])
def test_a_genai_decoder_loads_and_every_node_is_costed(precision: str, s: int, p: int) -> None:
    result = onnxlens.analyze(DATA / precision / "model.onnx", dims=_dims(s, p))
    assert not result.incomplete and not result.unsupported_ops
    assert any("SimplifiedLayerNormalization" in w and "default domain" in w
               for w in result.warnings)
    assert result.total.macs == _macs(s, p)
    # int4 weights: the builder's MatMulNBits run at accuracy level 4 (int8 MACs); attention
    # multiplies the float32 cache.
    want = ({"float32": _macs(s, p)} if precision == "fp32"
            else {"int8": 20480 * s, "float32": 128 * s * (p + s)})
    assert result.macs_by_dtype == want
    assert result.default_precision == ("fp32" if precision == "fp32" else "graph")


def test_the_llm_view_reads_the_builders_cache_layout() -> None:
    """KV bytes per token: 2 (K and V) x 2 layers x 1 KV head x 16 x 4 bytes = 256."""
    result = onnxlens.analyze(DATA / "int4" / "model.onnx", hardware=["a100"], prompt_len=8,
                              context_len=[16, 64])
    llm = result.llm
    assert (llm["layers"], llm["kv_heads"], llm["head_dim"]) == (2, 1, 16)
    assert llm["kv_cache_bytes_per_token"] == 256
    assert llm["prefill"]["macs"] == _macs(8, 0)
    assert [d["macs"] for d in llm["context_sweep"]] == [_macs(1, 15), _macs(1, 63)]
    assert llm["precision"] == "graph"
    assert llm["decode"]["estimates"]["a100"]["tokens_per_s"] > 0


def test_compare_runs_a_kv_cache_step_on_ort_and_native() -> None:
    """Inputs from the pinned dims and an all-ones mask (a random one makes ORT's
    GroupQueryAttention refuse: 'seqlens_k ... is out of range'); every ORT kernel maps to one
    of our groups; native-cpu runs the step too (GroupQueryAttention, MatMulNBits with int8
    activations as ORT's), near ORT's outputs but not within its tolerance."""
    from onnxlens.backends.compare import compare

    result = compare(DATA / "int4" / "model.onnx", ["ort-cpu", "native-cpu"], runs=2, warmup=1,
                     profile_runs=1, samples=1, memory=False, dims=_dims(4, 3),
                     hardware={"ort-cpu": "a100"})
    assert set(result.runs) == {"ort-cpu", "native-cpu"} and not result.unavailable
    [pair] = result.agreements
    assert {o.name for o in pair.outputs} >= {"logits", "present.1.value"}
    assert min(o.min_cosine for o in pair.outputs) >= 0.9999
    times = result.runs["ort-cpu"].times
    assert times is not None and times.unmapped_share == 0
    assert times.mapped_kernels == len(times.kernels) > 0
    assert result.analysis.total.macs == _macs(4, 3)
    estimate = result.runs["ort-cpu"].estimate
    assert estimate is not None and estimate.precision == "graph"
    assert estimate.profile.key == load_profile("a100").key


@pytest.mark.parametrize("lengths", [
    {k: v for k, v in _dims(1, 7).items() if k != "kv_cache_dim"}, None])
def test_the_kv_cache_head_dim_is_pinned_from_the_model_when_the_user_does_not(
        lengths: dict[str, int] | None) -> None:
    """`--dim` without kv_cache_dim (a user pinning only the lengths), or no `--dim` at all:
    the head size is read from GroupQueryAttention's packed query width, (2 + 2·1)·16 = 64
    columns: 16; the analysis says so (`dims_added`, which compare pins in the inputs it makes)
    and ORT runs them, where a cache of head size 1 made it refuse ('Input past_key dimension
    3 should match the packed KV head dimension')."""
    from onnxlens.backends.compare import compare

    result = onnxlens.analyze(DATA / "fp32" / "model.onnx", dims=lengths)
    assert "kv_cache_dim" not in result.symbols
    assert any("--dim kv_cache_dim=16 added" in w for w in result.warnings)
    assert result.graph.infos[result.graph.producer["present.0.key"]].outputs[1].dims[3] == 16
    measured = compare(DATA / "fp32" / "model.onnx", ["ort-cpu"], runs=1, warmup=0,
                       profile_runs=1, samples=1, memory=False, dims=lengths)
    assert set(measured.runs) == {"ort-cpu"} and not measured.unavailable
    assert measured.settings["dims"]["kv_cache_dim"] == 16


def test_the_head_dim_is_pinned_before_the_one_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pin is read from the loaded model before the analysis, which runs once at 16: the
    head dim left named had made it symbolic (an analysis per sample point, 5) and then a
    sixth at the pin. MACs at s=1, p=7 by hand: 20480 + 128 x 8 = 21504."""
    from onnxlens.analyzer import analysis

    analyses = []
    analyze_model = analysis._analyze_model
    monkeypatch.setattr(analysis, "_analyze_model",
                        lambda *a: analyses.append(a) or analyze_model(*a))
    lengths = {k: v for k, v in _dims(1, 7).items() if k != "kv_cache_dim"}
    result = onnxlens.analyze(DATA / "fp32" / "model.onnx", dims=lengths)
    assert len(analyses) == 1 and result.dims_added == {"kv_cache_dim": 16}
    assert result.total.macs == _macs(1, 7) == 21504 and not result.symbols
