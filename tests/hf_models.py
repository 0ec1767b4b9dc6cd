"""Tiny Hugging Face models (random weights) and their torch exports, shared by the tests that
fuse, cost and run them. Built from configs: nothing is downloaded."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import transformers

VOCAB = 64


def build(name: str, *, layers: int, hidden: int, heads: int | None = None,
          intermediate: int | None = None, positions: int = 64, vocab: int = VOCAB
          ) -> torch.nn.Module:
    """GPT-2, BERT, or a grouped-query-attention Llama (half as many KV heads as query heads).
    By default tiny: heads of 16, an MLP of 2 x hidden (GPT-2's is 4 x hidden), 64 positions."""
    heads = heads or max(2, hidden // 16)
    intermediate = intermediate or 2 * hidden
    if name == "gpt2":
        return transformers.GPT2Model(transformers.GPT2Config(
            n_embd=hidden, n_layer=layers, n_head=heads, vocab_size=vocab,
            n_positions=positions))
    if name == "bert":
        return transformers.BertModel(transformers.BertConfig(
            hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=intermediate, vocab_size=vocab,
            max_position_embeddings=positions))
    return transformers.LlamaModel(transformers.LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads // 2, intermediate_size=intermediate, vocab_size=vocab,
        max_position_embeddings=positions))


# Keyword arguments of each model's forward: no KV cache returned.
FORWARD = {"gpt2": {"use_cache": False}, "bert": {}, "llama": {"use_cache": False}}


class _Hidden(torch.nn.Module):
    """The last hidden state from (input_ids, attention_mask) positionally: the TorchScript
    exporter takes no keyword inputs."""

    def __init__(self, model: torch.nn.Module, kwargs: dict[str, object]) -> None:
        super().__init__()
        self.model, self.kwargs = model, kwargs

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask, **self.kwargs)[0]


def export(name: str, path: Path, *, layers: int, hidden: int, seq: int,
           dynamo: bool = True, **sizes: int) -> Path:
    """`name` exported to `path` with torch's dynamo exporter, or the TorchScript one
    (`sizes`: `build`'s heads, intermediate, positions, vocab)."""
    torch.manual_seed(0)
    model = build(name, layers=layers, hidden=hidden, **sizes).eval()
    ids = torch.randint(0, VOCAB, (1, seq))
    mask = torch.ones(1, seq, dtype=torch.int64)
    names = ["input_ids", "attention_mask"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(model, (ids,), str(path), kwargs={"attention_mask": mask,
                                                                **FORWARD[name]},
                              dynamo=True, input_names=names, external_data=False)
        else:
            torch.onnx.export(_Hidden(model, FORWARD[name]), (ids, mask), str(path),
                              dynamo=False, input_names=names)
    return path


class _WithCache(torch.nn.Module):
    """A causal LM's step as an LLM export has it: (input_ids, attention_mask, past K/V of every
    layer) -> (logits, present K/V of every layer), the cache in transformers' DynamicCache."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.layers = model, model.config.num_hidden_layers

    def forward(self, ids: torch.Tensor, mask: torch.Tensor,
                past: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        cache = transformers.DynamicCache(config=self.model.config)
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=ids, attention_mask=mask, past_key_values=cache,
                         use_cache=True)
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def export_with_cache(model: torch.nn.Module, path: Path) -> Path:
    """A causal LM exported by dynamo with its KV cache as inputs and outputs named as
    Hugging Face's optimum names them (`past_key_values.N.key/value`, `present.N.key/value`),
    dims `sequence_length`, `past_sequence_length` and `total_sequence_length` symbolic."""
    step = _WithCache(model.eval())
    probe = model(input_ids=torch.zeros(1, 1, dtype=torch.int64), use_cache=True)
    keys = probe.past_key_values.layers[0].keys  # [batch, kv heads, tokens, head dim]
    past = [torch.randn(1, keys.shape[1], 4, keys.shape[3]) for _ in range(2 * step.layers)]
    slots = [f"{i}.{kv}" for i in range(step.layers) for kv in ("key", "value")]
    new, old = torch.export.Dim("sequence_length", max=4096), torch.export.Dim(
        "past_sequence_length", max=4096)
    shapes = {"ids": {1: new}, "mask": {1: torch.export.Dim("total_sequence_length", max=8192)},
              "past": [{2: old} for _ in past]}
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(step, (ids, torch.ones(1, 12, dtype=torch.int64), past), str(path),
                          dynamo=True, dynamic_shapes=shapes, external_data=False,
                          input_names=["input_ids", "attention_mask",
                                       *(f"past_key_values.{s}" for s in slots)],
                          output_names=["logits", *(f"present.{s}" for s in slots)])
    return path
