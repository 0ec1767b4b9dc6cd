"""The LLM view of an encoder-decoder's decoder with a KV cache, as optimum exports T5, BART,
Marian and Whisper (`past_key_values.N.decoder.key` self-attention, `.encoder.key`
cross-attention, `present.N.*`): a tiny one written here in torch, checked against hand-counted
MACs and cache bytes. The cross-attention cache holds the encoder's tokens at every step, so it
is not in kv_cache_bytes_per_token."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from onnxlens import analyze
from onnxlens.analyzer.errors import UsageError
from onnxlens.analyzer.ir import TensorInfo
from onnxlens.analyzer.llm import kv_layout

LAYERS, HIDDEN, HEADS, VOCAB, ENCODER_LEN = 2, 64, 4, 96, 24
HEAD_DIM = HIDDEN // HEADS


def _attend(q, k, v):
    return torch.softmax(q @ k.transpose(2, 3) / HEAD_DIM ** 0.5, dim=-1) @ v


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o, self.cq, self.co = (
            nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(6))

    def heads(self, x):
        return x.view(x.shape[0], x.shape[1], HEADS, HEAD_DIM).transpose(1, 2)

    def merge(self, x):
        return x.transpose(1, 2).reshape(x.shape[0], -1, HIDDEN)

    def forward(self, x, past_k, past_v, cross_k, cross_v):
        k = torch.cat([past_k, self.heads(self.k(x))], dim=2)
        v = torch.cat([past_v, self.heads(self.v(x))], dim=2)
        x = x + self.o(self.merge(_attend(self.heads(self.q(x)), k, v)))
        # cross-attention reads the encoder's K and V from the cache: no projection of them here
        x = x + self.co(self.merge(_attend(self.heads(self.cq(x)), cross_k, cross_v)))
        return x, k, v


class _Decoder(nn.Module):
    """The layers between an embedding and the LM head tied to it (BART, Marian, T5 and
    Whisper tie them)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(_Layer() for _ in range(LAYERS))

    def forward(self, input_ids, *past):
        x, present = self.embed(input_ids), []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, *past[4 * i:4 * i + 4])
            present += [k, v, past[4 * i + 2], past[4 * i + 3]]
        return (x @ self.embed.weight.T, *present)


def _export(path, *, new_tokens_named: bool) -> str:
    names = [f"past_key_values.{i}.{side}.{kv}" for i in range(LAYERS)
             for side in ("decoder", "encoder") for kv in ("key", "value")]
    axes = {n: {2: "past_decoder_sequence_length" if ".decoder." in n else
                "encoder_sequence_length"} for n in names}
    if new_tokens_named:
        axes["input_ids"] = {1: "decoder_sequence_length"}
    args = (torch.zeros(1, 1, dtype=torch.int64),
            *[torch.zeros(1, HEADS, 3 if ".decoder." in n else ENCODER_LEN, HEAD_DIM)
              for n in names])
    torch.onnx.export(_Decoder().eval(), args, str(path), dynamo=False, dynamic_axes=axes,
                      input_names=["input_ids", *names],
                      output_names=["logits", *[n.replace("past_key_values", "present")
                                                for n in names]])
    return str(path)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _export(tmp_path_factory.mktemp("encdec") / "named.onnx", new_tokens_named=True)


PINNED = {"encoder_sequence_length": ENCODER_LEN}
SELF_BYTES = 2 * LAYERS * HEADS * HEAD_DIM * 4  # K and V, per layer and head, fp32: 1,024


def _macs(new: int, past: int) -> int:
    """Hand count of a step: self-attention q, k, v, o and cross-attention q, o projections;
    Q·Kᵀ and P·V over past + new self keys and over the encoder's keys; the LM head."""
    attention = 2 * HEADS * new * HEAD_DIM * ((past + new) + ENCODER_LEN)
    return LAYERS * (6 * new * HIDDEN * HIDDEN + attention) + new * HIDDEN * VOCAB


def test_the_cross_cache_is_counted_apart(decoder: str) -> None:
    llm = analyze(decoder, prompt_len=8, context_len=32, dims=PINNED).llm
    assert llm["layers"] == LAYERS and llm["kv_cache_bytes_per_token"] == SELF_BYTES == 1024
    cross = llm["cross_attention"]
    assert (cross["layers"], cross["kv_cache_bytes_per_encoder_token"]) == (LAYERS, SELF_BYTES)
    assert cross["encoder_len"] == ENCODER_LEN


def test_phases_match_a_hand_count_and_memory_holds_both_caches(decoder: str) -> None:
    llm = analyze(decoder, prompt_len=8, context_len=[32, 64], dims=PINNED).llm
    assert llm["prefill"]["macs"] == _macs(new=8, past=0)
    assert [d["macs"] for d in llm["context_sweep"]] == [_macs(1, 31), _macs(1, 63)]
    mem = llm["context_sweep"][1]["memory"]
    assert mem["kv_cache_bytes"] == 64 * SELF_BYTES
    assert mem["cross_kv_cache_bytes"] == ENCODER_LEN * SELF_BYTES  # the same at any context
    assert mem["total_bytes"] == (mem["weights_bytes"] + 64 * SELF_BYTES
                                  + ENCODER_LEN * SELF_BYTES + mem["activation_bytes"])


def test_an_unpinned_encoder_length_is_named(decoder: str) -> None:
    with pytest.raises(UsageError, match="--dim encoder_sequence_length=N"):
        analyze(decoder, prompt_len=8)
    result = analyze(decoder)  # no view asked for: a warning, the analysis stands
    assert not result.llm
    assert any("no LLM view" in w and "encoder_sequence_length" in w for w in result.warnings)


def test_a_step_fixed_at_one_token_prefills_one(tmp_path) -> None:
    """optimum's decoder-with-past traces one new token: its prefill is that step, and its
    tokens/s counts one token, not the prompt asked for."""
    path = _export(tmp_path / "fixed.onnx", new_tokens_named=False)
    result = analyze(path, hardware=["a100"], prompt_len=8, context_len=32, dims=PINNED)
    pre = result.llm["prefill"]
    assert pre["prompt_len"] == 1 and pre["macs"] == _macs(new=1, past=0)
    assert pre["estimates"]["a100"]["tokens_per_s"] == pytest.approx(
        1 / pre["estimates"]["a100"]["latency_s"])
    assert any("prefill is 1, not 8" in w for w in result.warnings)


def test_onnxruntime_genai_whisper_names() -> None:
    """`past_key_self_N` / `past_key_cross_N`: self and cross caches told apart by name."""
    def cache(name: str, length: str) -> TensorInfo:
        return TensorInfo(name, 10, (1, 6, length, 64))  # fp16

    inputs = [cache(f"past_{kv}_{side}_{i}", "past_sequence_length" if side == "self"
                    else "encoder_sequence_length_out")
              for i in range(4) for side in ("self", "cross") for kv in ("key", "value")]
    layout = kv_layout([TensorInfo("input_ids", 7, (1, "sequence_length")), *inputs])
    assert (layout.layers, layout.past_dim) == (4, "past_sequence_length")
    assert layout.kv_cache_bytes_per_token == 2 * 4 * 6 * 64 * 2
    assert layout.cross.encoder_len == "encoder_sequence_length_out"
