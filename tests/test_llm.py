"""The LLM view: a tiny grouped-query-attention decoder with a KV cache, written here in torch
and exported with named dims as decoders ship for ONNX Runtime (past_key_values.N.key/value,
present.N.*), checked against hand-counted MACs and cache bytes."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from onnxlens import analyze
from onnxlens.analyzer.errors import UsageError
from onnxlens.analyzer.llm import decode_dims, kv_layout, prefill_dims

LAYERS, HIDDEN, HEADS, KV_HEADS, VOCAB = 2, 64, 4, 2, 96
HEAD_DIM = HIDDEN // HEADS


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.k = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x, past_k, past_v):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        rep = HEADS // KV_HEADS  # GQA: each KV head serves `rep` query heads
        kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        p = torch.softmax(q @ kk.transpose(2, 3) / HEAD_DIM ** 0.5, dim=-1)
        return x + self.o((p @ vv).transpose(1, 2).reshape(b, s, HIDDEN)), k, v


class _Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(_Layer() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids, attention_mask, *past):
        x = self.embed(input_ids) * attention_mask[:, -1:, None].to(torch.float32)
        present = []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, past[2 * i], past[2 * i + 1])
            present += [k, v]
        return (self.head(x), *present)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("llm") / "decoder.onnx"
    kv = [f"past_key_values.{i}.{n}" for i in range(LAYERS) for n in ("key", "value")]
    out_kv = [f"present.{i}.{n}" for i in range(LAYERS) for n in ("key", "value")]
    cache_axes = {0: "batch_size", 2: "past_sequence_length"}
    args = (torch.zeros(1, 3, dtype=torch.int64), torch.ones(1, 5, dtype=torch.int64),
            *[torch.zeros(1, KV_HEADS, 2, HEAD_DIM) for _ in kv])
    torch.onnx.export(
        _Decoder().eval(), args, str(path), dynamo=False,
        input_names=["input_ids", "attention_mask", *kv], output_names=["logits", *out_kv],
        dynamic_axes={"input_ids": {0: "batch_size", 1: "sequence_length"},
                      "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
                      **dict.fromkeys(kv, cache_axes)})
    return str(path)


def _matmul_macs(new: int, past: int) -> int:
    """Hand count of one forward step: projections, attention and the LM head."""
    total = past + new
    proj = new * HIDDEN * (HIDDEN + 2 * KV_HEADS * HEAD_DIM + HIDDEN)  # q, k, v, o
    attn = 2 * HEADS * new * total * HEAD_DIM  # Q·Kᵀ and P·V, per query head
    return LAYERS * (proj + attn) + new * HIDDEN * VOCAB


def test_layout_reads_kv_heads_not_query_heads(decoder: str) -> None:
    result = analyze(decoder, prompt_len=8, context_len=32)
    layout = kv_layout(result.declared_inputs)
    assert (layout.layers, layout.kv_heads, layout.head_dim) == (LAYERS, KV_HEADS, HEAD_DIM)
    # 2 (K and V) x 2 layers x 2 KV heads x 16 x 4 bytes; query heads (4) would double it.
    assert layout.kv_cache_bytes_per_token == 2 * 2 * 2 * 16 * 4 == 512
    assert result.llm["kv_cache_bytes_per_token"] == 512


def test_phases_pin_the_named_dims(decoder: str) -> None:
    layout = kv_layout(analyze(decoder).declared_inputs)
    assert prefill_dims(layout, 8) == {"past_sequence_length": 0, "sequence_length": 8,
                                       "total_sequence_length": 8}
    assert decode_dims(layout, 32) == {"past_sequence_length": 31, "sequence_length": 1,
                                       "total_sequence_length": 32}
    with pytest.raises(UsageError, match="context"):
        decode_dims(layout, 0)


def test_prefill_and_decode_macs_match_a_hand_count(decoder: str) -> None:
    llm = analyze(decoder, prompt_len=8, context_len=[32, 64]).llm
    assert llm["prefill"]["macs"] == _matmul_macs(new=8, past=0)
    assert llm["decode"]["macs"] == _matmul_macs(new=1, past=31)
    assert [d["macs"] for d in llm["context_sweep"]] == [_matmul_macs(1, 31), _matmul_macs(1, 63)]
    assert llm["prefill"]["complete"] and llm["decode"]["complete"]


def test_memory_at_context(decoder: str) -> None:
    result = analyze(decoder, prompt_len=8, context_len=100, batch=2)
    mem = result.llm["decode"]["memory"]
    weights = 4 * (VOCAB * HIDDEN + LAYERS * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS
                                              * HEAD_DIM) + HIDDEN * VOCAB)
    assert mem["weights_bytes"] == weights
    assert mem["kv_cache_bytes"] == 2 * 100 * 512
    assert mem["total_bytes"] == weights + 2 * 100 * 512 + mem["activation_bytes"]


def test_estimates_give_tokens_per_second(decoder: str) -> None:
    llm = analyze(decoder, hardware=["a100"], prompt_len=16, context_len=64).llm
    pre, dec = llm["prefill"]["estimates"]["a100"], llm["decode"]["estimates"]["a100"]
    assert pre["tokens_per_s"] == pytest.approx(16 / pre["latency_s"])
    assert dec["tokens_per_s"] == pytest.approx(1 / dec["latency_s"])
    # A decode step reads every weight for one token: slower per token than prefill.
    assert dec["tokens_per_s"] < pre["tokens_per_s"]


def test_json_and_cli(decoder: str, tmp_path, capsys) -> None:
    from typer.testing import CliRunner

    from onnxlens.cli import app

    out = tmp_path / "a.json"
    run = CliRunner().invoke(app, ["analyze", decoder, "--prompt-len", "8", "--context-len",
                                   "16,32", "-H", "a100", "--json", str(out)])
    assert run.exit_code == 0, run.output
    assert "prefill" in run.output and "decode" in run.output
    d = json.loads(out.read_text())
    assert d["llm"]["layers"] == LAYERS
    assert [r["context_len"] for r in d["llm"]["context_sweep"]] == [16, 32]


@pytest.mark.parametrize(("value", "why"), [("0", "values must be positive"),
                                            ("16,x", "expected integers separated by commas")])
def test_a_bad_context_len_is_a_one_line_error(decoder: str, value: str, why: str) -> None:
    """Parsed where every other usage error is: exit status 2, one line, no traceback."""
    from typer.testing import CliRunner

    from onnxlens.cli import app

    run = CliRunner().invoke(app, ["analyze", decoder, "--context-len", value])
    assert run.exit_code == 2, run.exception
    assert f"--context-len '{value}': {why}" in run.output


def test_a_context_shorter_than_the_prompt_is_a_one_line_error(decoder: str) -> None:
    """Decode steps follow the prompt: --context-len under --prompt-len exits 2 with one line
    naming both. Given alone, a context under the default prompt (512) shortens the prompt
    to it: prefill of 64 tokens, hand-counted."""
    from typer.testing import CliRunner

    from onnxlens.cli import app

    run = CliRunner().invoke(app, ["analyze", decoder, "--prompt-len", "64", "--context-len",
                                   "128,32"])
    assert run.exit_code == 2, run.exception
    assert "--context-len 32 is shorter than --prompt-len 64" in run.output
    assert "Traceback" not in run.output
    llm = analyze(decoder, context_len=[64, 128]).llm
    assert llm["prefill"]["prompt_len"] == 64
    assert llm["prefill"]["macs"] == _matmul_macs(new=64, past=0)


def test_prompt_len_on_a_model_without_cache_is_a_usage_error(tmp_path) -> None:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g), path)
    with pytest.raises(UsageError, match="no KV-cache"):
        analyze(str(path), prompt_len=8)


def test_a_batch_pinned_by_dim_is_the_views_batch(decoder: str) -> None:
    """--dim batch_size=2 doubles the MACs (two sequences); tokens/s and the KV cache follow
    the same batch, not --batch's default of 1."""
    one = analyze(decoder, hardware=["a100"], prompt_len=8, context_len=32).llm
    two = analyze(decoder, hardware=["a100"], prompt_len=8, context_len=32,
                  dims={"batch_size": 2}).llm
    assert two["prefill"]["macs"] == 2 * one["prefill"]["macs"] == 2 * _matmul_macs(8, 0)
    assert (one["batch"], two["batch"]) == (1, 2)
    dec = two["decode"]["estimates"]["a100"]
    assert dec["tokens_per_s"] == pytest.approx(2 / dec["latency_s"])
    assert two["decode"]["memory"]["kv_cache_bytes"] == 2 * 32 * 512


def test_a_dim_pinned_by_dim_outside_the_phases_wins_over_batch(tmp_path) -> None:
    """A named dim that is neither the batch nor a phase's (here the rows of an extra input)
    keeps the user's --dim in both phases: batch 2 must not pin it too."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    width, kv = 8, ["batch_size", KV_HEADS, "past_sequence_length", HEAD_DIM]
    new = ["batch_size", KV_HEADS, "sequence_length", HEAD_DIM]
    g = helper.make_graph(
        [helper.make_node("MatMul", ["extra", "w"], ["y"]),
         helper.make_node("Concat", ["past_key", "new_key"], ["present_key"], axis=2)], "g",
        [helper.make_tensor_value_info("extra", TensorProto.FLOAT,
                                       ["batch_size", "rows", width]),
         helper.make_tensor_value_info("new_key", TensorProto.FLOAT, new),
         helper.make_tensor_value_info("past_key", TensorProto.FLOAT, kv)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch_size", "rows", width]),
         helper.make_tensor_value_info("present_key", TensorProto.FLOAT,
                                       ["batch_size", KV_HEADS, "total", HEAD_DIM])],
        [numpy_helper.from_array(np.ones((width, width), np.float32), "w")])
    path = tmp_path / "kv.onnx"
    onnx.save(helper.make_model(g), path)
    llm = analyze(str(path), batch=2, dims={"rows": 5}, prompt_len=4, context_len=8).llm
    # The MatMul: batch 2 x 5 rows x 8 x 8 MACs (rows at the batch would give 2 x 2 x 64)
    assert llm["prefill"]["macs"] == llm["decode"]["macs"] == 2 * 5 * width * width == 640
    assert llm["batch"] == 2


def test_a_phase_with_unknown_costs_is_flagged(tmp_path) -> None:
    """A decoder whose logits hang on a data-dependent shape (NonZero of the mask: what a
    trace specialized on a short past leaves behind) gets phases with unknown costs: the JSON
    says `complete: false`, a warning names the phase's dims, the table marks the row."""
    import onnx
    from onnx import TensorProto, helper
    from typer.testing import CliRunner

    from onnxlens.cli import app

    cache = [helper.make_tensor_value_info(f"past_key_values.0.{n}", TensorProto.FLOAT,
                                           ["batch_size", 1, "past_sequence_length", 4])
             for n in ("key", "value")]
    g = helper.make_graph(
        [helper.make_node("NonZero", ["attention_mask"], ["nz"]),
         helper.make_node("Cast", ["nz"], ["logits"], to=TensorProto.FLOAT),
         helper.make_node("Identity", ["past_key_values.0.key"], ["present.0.key"])], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                       ["batch_size", "sequence_length"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                       ["batch_size", "total_sequence_length"]), *cache],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, "n"]),
         helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT,
                                       ["batch_size", 1, "past_sequence_length", 4])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    llm = analyze(str(path), prompt_len=8, context_len=16).llm
    assert llm["prefill"]["complete"] is False and llm["decode"]["complete"] is False
    run = CliRunner().invoke(app, ["analyze", str(path), "--prompt-len", "8",
                                   "--context-len", "16", "-H", "a100"])
    assert run.exit_code == 0, run.output
    assert "prefill (incomplete)" in run.output and "decode @16 (incomplete)" in run.output
    assert "LLM view at past_sequence_length=15" in " ".join(run.output.split())


def test_the_html_report_has_the_llm_view(decoder: str) -> None:
    """Each phase and profile a row with the view's own figures; the KV cache at context 32 is
    32 tokens x 512 B."""
    from onnxlens.reports.html import render_html

    result = analyze(decoder, hardware=["a100"], prompt_len=8, context_len=[16, 32])
    page = render_html(result.to_dict())
    assert 'id="llm"' in page and "prefill 8" in page and "decode @32" in page
    assert "16.00 KiB" in page  # binary(32 * 512)
    assert f"{LAYERS} layers, {KV_HEADS} KV heads x {HEAD_DIM}" in page
    # A saved JSON is read back as it is: what it says is text on the page.
    crafted = result.to_dict()
    crafted["llm"]["sliding_window"] = [{"layers": "<b>x</b>", "window": 4}]
    page = render_html(crafted)
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt; layer(s)" in page


def test_a_hugging_face_export_with_its_cache(tmp_path) -> None:
    """transformers' Llama (GQA: 4 query heads, 2 KV heads of 16) exported by dynamo with its
    DynamicCache as inputs and outputs, as `benchmarks/llm_accuracy.py`'s hfllama rows are:
    the LLM view reads its KV heads, its steps' MACs are the hand count from the config, and
    each layer is one attention group."""
    import transformers
    from hf_models import export_with_cache

    from onnxlens.analyzer.fusion import ATTENTION

    torch.manual_seed(0)
    mlp = 2 * HIDDEN
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=mlp, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256))
    path = export_with_cache(model, tmp_path / "llama.onnx")
    result = analyze(path, prompt_len=8, context_len=32)
    assert result.llm["kv_cache_bytes_per_token"] == 2 * LAYERS * KV_HEADS * HEAD_DIM * 4
    swiglu = 3 * HIDDEN * mlp  # gate, up and down projections a token
    assert result.llm["prefill"]["macs"] == _matmul_macs(new=8, past=0) + LAYERS * 8 * swiglu
    assert result.llm["decode"]["macs"] == _matmul_macs(new=1, past=31) + LAYERS * swiglu
    decode = analyze(path, dims=decode_dims(kv_layout(result.declared_inputs), 32))
    assert sum(ATTENTION in g.pattern for g in decode.groups) == LAYERS
