"""The LLM view of a decoder with a KV cache: its cache layout, and the prefill and decode phases.

A decoder exported for ONNX Runtime (onnxruntime-genai's model builder, Hugging Face optimum,
`torch.onnx.export` with a cache) takes the cache as inputs, one key and one value per layer:

    past_key_values.N.key / .value   [batch, kv_heads, past_sequence_length, head_dim]
    past_key / past_value            (one layer; a single attention block)

and returns the grown cache as `present.N.key / .value`. The cache layout is read from the key
inputs' shapes (BNSH, as ORT's GroupQueryAttention and Hugging Face keep it):

    kv_cache_bytes_per_token = 2 (key and value) × layers × kv_heads × head_dim × element bytes

so grouped-query attention counts its KV heads, not its query heads (LLM-Viewer's formula used
the query heads, overstating a GQA model's cache by num_heads / kv_heads).

The phases pin the model's named dims (the key inputs' third dim is the past length; the ids'
second the new tokens; the attention mask's last the total):

    prefill(P):  sequence_length = P, past = 0,     total = P       (the prompt, empty cache)
    decode(C):   sequence_length = 1, past = C - 1, total = C       (one token at context C)

and each is analyzed like any model. Decode tokens/s = batch / decode latency; memory at context
C = weights + batch × C × kv_cache_bytes_per_token + the larger activation peak of the phases.

Sliding-window layers (Gemma 2/3, gpt-oss, as the model builder writes them for CPU and CUDA) keep
a cache of their own: their GroupQueryAttention has `sliding_window_cache = 1` and
`local_window_size = W`, their cache inputs name another dim (`past_sliding_length`). ORT 1.31
keeps it as a buffer of fixed capacity, past and present alike, and refuses one under W ("KV
cache capacity (0) must be at least local_window_size"), even at prefill: such a layer's past
dim is W in every phase (the builder's runtime adds `cache_slack`, 0 by default), and it holds W
tokens at any context. A decode step attends exactly W keys there (checked against ORT).

The decoder of an encoder-decoder (T5, BART, Marian, Whisper: optimum's decoder-with-past names
`past_key_values.N.decoder.key` its self-attention cache and `past_key_values.N.encoder.key` its
cross-attention cache; onnxruntime-genai's Whisper `past_key_self_N` / `past_key_cross_N`) holds
two caches. The self-attention one grows a token a step, as above. The cross-attention one is
the K and V of the encoder's output, computed once per input and only read by every step: it
holds the encoder's tokens, whatever the context, so it is not in kv_cache_bytes_per_token:

    cross_kv_cache_bytes = 2 × layers × kv_heads × head_dim × element bytes × encoder tokens

JSON `llm.cross_attention` gives its per-encoder-token bytes; memory at a context adds it once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import UsageError
from .graph import ModelGraph
from .ir import TensorInfo, dtype_bytes


# `past_key_values.3.key`, `past.3.value`, `past_key_values_3_key`, an encoder-decoder's
# `past_key_values.3.decoder.key` (self) / `.encoder.key` (cross); `past_key` (one layer) and
# `past_key_self_3` / `past_key_cross_3` (onnxruntime-genai's Whisper).
# The grown cache a step returns is named alike, `present` for `past` / `past_key_values`.
def _cache_names(prefix: str) -> tuple[re.Pattern[str], ...]:
    return (re.compile(rf"^{prefix}[._](?P<layer>\d+)[._](?:(?P<side>decoder|encoder)[._])?"
                       r"(?P<kv>key|value)$"),
            re.compile(rf"^{prefix}_(?P<kv>key|value)(?:_(?P<side>self|cross)_(?P<layer>\d+))?$"))


_CACHE_NAMES = {"past": _cache_names("past(?:_key_values)?"), "present": _cache_names("present")}
_CROSS_SIDES = ("encoder", "cross")


def _cache_slot(name: str, io: str = "past") -> tuple[int, bool] | None:
    """(layer, is cross-attention) of a KV-cache input's (`io` "present": output's) name; None
    for any other tensor."""
    for pattern in _CACHE_NAMES[io]:
        if m := pattern.match(name):
            return int(m["layer"] or 0), m["side"] in _CROSS_SIDES
    return None


@dataclass(frozen=True)
class WindowedCache:
    """Layers whose cache inputs have a past dim of their own (`past_sliding_length`; a number
    once pinned at a window cache's capacity)."""

    past_dim: str | int
    window: int | None  # local_window_size of a `sliding_window_cache` attention; None: unbounded
    layers: int

    def tokens_held(self, tokens: int) -> int:
        """What a layer keeps of `tokens` (a phase's past dim, or the cache at a context): a
        window cache its capacity, W, whatever the count."""
        return tokens if self.window is None else self.window


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, element_bytes: int) -> int:
    """A cache's bytes per token it holds: key and value, for every layer, 2 · L · H_kv · d ·
    bytes (a decoder's self-attention cache, an encoder-decoder's cross-attention one)."""
    return 2 * layers * kv_heads * head_dim * element_bytes


@dataclass(frozen=True)
class CrossCache:
    """An encoder-decoder's cross-attention cache: the encoder output's K and V, one per layer,
    made once per input and read by every decoder step."""

    encoder_len: str | int  # the encoder's tokens (a name until pinned)
    layers: int
    kv_heads: int
    head_dim: int
    element_bytes: int

    @property
    def bytes_per_encoder_token(self) -> int:
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.element_bytes)

    def as_dict(self) -> dict[str, object]:
        return {"layers": self.layers, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "encoder_len": self.encoder_len,
                "kv_cache_bytes_per_encoder_token": self.bytes_per_encoder_token,
                "note": "held once per input at the encoder's length, whatever the context; "
                        "not in kv_cache_bytes_per_token"}


@dataclass(frozen=True)
class KvLayout:
    """Where a decoder keeps its cache, and what one token of it weighs."""

    layers: int
    kv_heads: int
    head_dim: int
    element_bytes: int
    past_dim: str          # the past length's dim name (e.g. past_sequence_length)
    new_dim: str | None    # the new tokens' dim name (sequence_length)
    total_dim: str | None  # the attention mask's length (total_sequence_length)
    head_dim_name: str | None = None  # a head dim the inputs name (kv_cache_dim), pinned too
    batch: int | None = None  # the batch the cache inputs fix (pinned by --dim); None: named
    windowed: tuple[WindowedCache, ...] = ()  # layers with a past dim other than past_dim
    cross: CrossCache | None = None  # an encoder-decoder's cross-attention cache
    fixed_new: int | None = None  # the new tokens a step where the export fixed them (no new_dim)

    @property
    def kv_cache_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.element_bytes)

    def tokens_held(self, context_len: int) -> int:
        """Cache entries (layer-tokens) after a step at `context_len`: every layer holds the
        context, a window cache its capacity."""
        windowed = sum(w.layers * w.tokens_held(context_len) for w in self.windowed)
        return (self.layers - sum(w.layers for w in self.windowed)) * context_len + windowed

    def as_dict(self) -> dict[str, object]:
        return {"layers": self.layers, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "kv_element_bytes": self.element_bytes,
                "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
                "dims": {"past": self.past_dim, "new": self.new_dim, "total": self.total_dim},
                **({"sliding_window": [{"window": w.window, "layers": w.layers}
                                       for w in self.windowed]}
                   if self.windowed else {}),
                **({"cross_attention": self.cross.as_dict()} if self.cross else {})}


def kv_cache_inputs(inputs: Sequence[TensorInfo], *, cross: bool = False
                    ) -> dict[int, list[TensorInfo]]:
    """The self-attention (or, `cross`, the cross-attention) cache inputs by layer index (a
    lone past_key/past_value is layer 0)."""
    layers: dict[int, list[TensorInfo]] = {}
    for t in inputs:
        slot = _cache_slot(t.name)
        if slot is not None and slot[1] == cross:
            layers.setdefault(slot[0], []).append(t)
    return layers


def kv_layout(inputs: Sequence[TensorInfo], graph: ModelGraph | None = None) -> KvLayout | None:
    """The cache layout of a decoder's inputs; None for a model without a KV cache. A head
    dim the inputs leave named (onnxruntime-genai's `kv_cache_dim`) is read from the attention
    node that reads the cache (`graph`)."""
    layers = kv_cache_inputs(inputs)
    if not layers:
        return None
    keys = [ts[0] for ts in layers.values()]
    _check_4d(keys)
    windows = {t.name: _cache_window(graph, t.name) if graph is not None else None
               for t in keys}
    # The layout's past dim is an unbounded layer's (a sliding layer's when all slide)
    key = next((t for t in keys if windows[t.name] is None), keys[0])
    shape = key.shape
    batch, kv_heads, past, head_dim = shape
    if not isinstance(head_dim, int) and graph is not None:
        head_dim = _head_dim_from_attention(graph, key.name) or head_dim
    if not isinstance(kv_heads, int) or not isinstance(head_dim, int):
        raise UsageError(f"KV-cache input {key.name!r}: kv_heads and head_dim (dims 1 and 3) "
                         f"must be numbers, found {shape}")
    if not isinstance(past, str):
        raise UsageError(f"KV-cache input {key.name!r}: the past length (dim 2) is fixed at "
                         f"{past}; the phases need it named (export with a dynamic axis)")
    by_name = {t.name: t for t in inputs}
    head_dim_name = shape[3] if isinstance(shape[3], str) else None
    return KvLayout(len(layers), kv_heads, head_dim, dtype_bytes(key.elem_type), past,
                    _named_dim(by_name, ("input_ids", "inputs_embeds"), 1, past),
                    _named_dim(by_name, ("attention_mask",), -1, past), head_dim_name,
                    batch if isinstance(batch, int) else None,
                    _windowed(keys, windows, past), _cross_cache(inputs),
                    _fixed_dim(by_name, ("input_ids", "inputs_embeds"), 1))


def _check_4d(keys: Sequence[TensorInfo]) -> None:
    for t in keys:
        if t.shape is None or len(t.shape) != 4:
            raise UsageError(f"KV-cache input {t.name!r}: expected a 4-D [batch, kv_heads, "
                             f"past_sequence_length, head_dim] shape, found {t.shape}")


def _cross_cache(inputs: Sequence[TensorInfo]) -> CrossCache | None:
    """The cross-attention cache of an encoder-decoder's decoder, from its first key input."""
    layers = kv_cache_inputs(inputs, cross=True)
    if not layers:
        return None
    keys = [ts[0] for ts in layers.values()]
    _check_4d(keys)
    _, kv_heads, encoder_len, head_dim = keys[0].shape
    if not isinstance(kv_heads, int) or not isinstance(head_dim, int):
        raise UsageError(f"cross-attention cache input {keys[0].name!r}: kv_heads and head_dim "
                         f"(dims 1 and 3) must be numbers, found {keys[0].shape}")
    return CrossCache(encoder_len, len(layers), kv_heads, head_dim,
                      dtype_bytes(keys[0].elem_type))


def _windowed(keys: Sequence[TensorInfo], windows: Mapping[str, int | None], past: str
              ) -> tuple[WindowedCache, ...]:
    """The layers whose cache's past dim is not `past`, by that dim (a number only where a
    window cache's capacity pins it)."""
    by_dim: dict[str | int, list[TensorInfo]] = {}
    for t in keys:
        dim = t.shape[2]
        if dim != past:
            if not isinstance(dim, str) and windows[t.name] is None:
                raise UsageError(f"KV-cache input {t.name!r}: the past length (dim 2) is fixed "
                                 f"at {dim}; the phases need it named")
            by_dim.setdefault(dim, []).append(t)
    return tuple(WindowedCache(dim, windows[ts[0].name], len(ts)) for dim, ts in by_dim.items())


def _cache_window(graph: ModelGraph, cache: str) -> int | None:
    """W of the attention reading `cache` when it keeps a window-sized cache
    (GroupQueryAttention's `sliding_window_cache = 1`, `local_window_size = W`); else None."""
    for key in graph.consumers.get(cache, ()):
        node = graph.infos[key]
        window = node.attr("local_window_size", -1)
        if node.attr("sliding_window_cache", 0) and window > 0:
            return window
    return None


def _head_dim_from_attention(graph: ModelGraph, cache: str) -> int | None:
    """Head size of the attention op reading `cache`, from its query width and head counts:
    GroupQueryAttention with packed QKV (no key input) has (num_heads + 2·kv_num_heads)·d
    columns, MultiHeadAttention / GroupQueryAttention with separate Q num_heads·d."""
    for key in graph.consumers.get(cache, ()):
        node = graph.infos[key]
        heads = node.attr("num_heads")
        q = node.inputs[0] if node.inputs else None
        if not heads or q is None or not q.shape or not isinstance(q.shape[-1], int):
            continue
        packed = node.op_type == "GroupQueryAttention" and (len(node.inputs) < 2
                                                            or node.inputs[1] is None)
        width = heads + 2 * node.attr("kv_num_heads", 0) if packed else heads
        return q.shape[-1] // width if q.shape[-1] % width == 0 else None
    return None


def window_pins(shapes: Mapping[str, Sequence[object]], graph: ModelGraph,
                dims: Mapping[str, int]) -> dict[str, int]:
    """A sliding-window cache's past dim (`past_sliding_length`) left unpinned -> its capacity,
    the W of the attention reading it (`_cache_window`): ORT refuses a smaller one, so a
    step's inputs need it at W whatever the context."""
    windows = {shape[2]: _cache_window(graph, name) for name, shape in _cache_shapes(shapes)
               if isinstance(shape[2], str) and shape[2] not in dims}
    return {dim: window for dim, window in windows.items() if window}


def several_past_dims(shapes: Mapping[str, Sequence[object]]) -> bool:
    """Whether the cache inputs name more than one past dim (a sliding-window layer's own)."""
    return len({shape[2] for _, shape in _cache_shapes(shapes)}) > 1


def _cache_shapes(shapes: Mapping[str, Sequence[object]]) -> list[tuple[str, Sequence[object]]]:
    """The 4-D KV-cache inputs of `shapes` (input name -> declared shape)."""
    return [(name, shape) for name, shape in shapes.items()
            if _cache_slot(name) is not None and len(shape) == 4]


def unpinned_head_dims(shapes: Mapping[str, Sequence[object]], dims: Mapping[str, int]
                       ) -> dict[str, str]:
    """KV-cache input -> its head dim's name, for the inputs (`shapes`: input name -> declared
    shape) whose head dim is named and not in `dims` (onnxruntime-genai's `kv_cache_dim`)."""
    return {name: shape[3] for name, shape in _cache_shapes(shapes)
            if isinstance(shape[3], str) and shape[3] not in dims}


def head_dim_pins(shapes: Mapping[str, Sequence[object]], graph: ModelGraph,
                  dims: Mapping[str, int]) -> dict[str, int]:
    """The `unpinned_head_dims`, each read from the attention node reading the cache
    (`_head_dim_from_attention`). The head size is the model's own: no phase changes it, and
    ORT refuses a cache of any other ("Input 'past_key' dimension 3 should match the packed KV
    head dimension"), so `--dim` and the inputs made to measure pin it for the user."""
    out: dict[str, int] = {}
    for cache, head in unpinned_head_dims(shapes, dims).items():
        if head not in out and (size := _head_dim_from_attention(graph, cache)):
            out[head] = size
    return out


def _named_dim(by_name: Mapping[str, TensorInfo], names: Sequence[str], axis: int,
               past: str) -> str | None:
    for name in names:
        t = by_name.get(name)
        if t is not None and t.shape and isinstance(t.shape[axis], str) and t.shape[axis] != past:
            return t.shape[axis]
    return None


def _fixed_dim(by_name: Mapping[str, TensorInfo], names: Sequence[str], axis: int
               ) -> int | None:
    for name in names:
        t = by_name.get(name)
        if t is not None and t.shape and isinstance(t.shape[axis], int):
            return t.shape[axis]
    return None


def phase_dims(layout: KvLayout, *, new: int, past: int) -> dict[str, int]:
    """The named dims of one forward step: `new` tokens on top of `past` cached ones."""
    dims = {layout.past_dim: past} | {w.past_dim: w.tokens_held(past) for w in layout.windowed
                                      if isinstance(w.past_dim, str)}
    if layout.head_dim_name:
        dims[layout.head_dim_name] = layout.head_dim
    if layout.new_dim:
        dims[layout.new_dim] = new
    if layout.total_dim:
        dims[layout.total_dim] = past + new
    return dims


def prefill_dims(layout: KvLayout, prompt_len: int) -> dict[str, int]:
    return phase_dims(layout, new=prompt_len, past=0)


def decode_dims(layout: KvLayout, context_len: int) -> dict[str, int]:
    if context_len < 1:
        raise UsageError(f"--context-len {context_len}: a decode step needs a context of at "
                         "least one token")
    return phase_dims(layout, new=1, past=context_len - 1)


def present_rows(layout: KvLayout, outputs: Sequence[TensorInfo]) -> int | None:
    """Cache entries (layer-tokens) a step's present outputs hold, which the next step reads:
    the sum of each self-attention layer's present key length, when every layer's is known.
    HF's sliding-window layers (Mistral, Gemma 2 exported through transformers' cache) return
    only their last W - 1 tokens, whatever the context."""
    rows: dict[int, object] = {}
    for t in outputs:
        slot = _cache_slot(t.name, "present")
        if slot is not None and not slot[1] and t.shape is not None and len(t.shape) == 4:
            rows.setdefault(slot[0], t.shape[2])  # key and value hold the same rows
    if len(rows) != layout.layers or not all(isinstance(r, int) for r in rows.values()):
        return None
    return sum(rows.values())  # type: ignore[arg-type]


def memory_at_context(layout: KvLayout, *, weight_bytes: int, batch: int, context_len: int,
                      activation_bytes: int | None, encoder_len: int = 0,
                      held: int | None = None) -> dict[str, int | None]:
    """Weights + KV cache (+ an encoder-decoder's cross-attention cache at `encoder_len`) +
    activations at a context length (bytes). `held`: the layer-tokens the step's present
    outputs hold (`present_rows`), when known; else every layer holds the context, a window
    cache its capacity."""
    per_layer_token = layout.kv_cache_bytes_per_token // layout.layers
    tokens = held if held is not None else layout.tokens_held(context_len)
    kv = batch * tokens * per_layer_token
    cross = batch * encoder_len * layout.cross.bytes_per_encoder_token if layout.cross else 0
    total = (weight_bytes + kv + cross + activation_bytes if activation_bytes is not None
             else None)
    return {"weights_bytes": weight_bytes, "kv_cache_bytes": kv,
            **({"cross_kv_cache_bytes": cross} if layout.cross else {}),
            "activation_bytes": activation_bytes, "total_bytes": total}


def unpinned_encoder_len(layout: KvLayout, dims: Mapping[str, int]) -> str | None:
    """The cross-attention cache's length dim when neither the model nor `--dim` fixes it: the
    phases cannot choose it (a Whisper encoder holds 1500 tokens, a translation its source)."""
    dim = layout.cross.encoder_len if layout.cross else None
    return dim if isinstance(dim, str) and dim not in dims else None
