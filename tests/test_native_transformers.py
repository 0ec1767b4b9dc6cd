"""The native executor runs Hugging Face transformers as torch's dynamo exporter writes them
(GPT-2, BERT, a grouped-query-attention Llama; random weights, 1-2 layers, hidden 32-64): the
causal and padding masks (IsNaN, Where, Expand), GatherND / GatherElements position and
pooler indexing, scalar-index Gather; every output agrees with ONNX Runtime to cosine
>= 0.9999, with a padded attention mask as well as an all-ones one."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from onnxlens.backends.native_cpu import NativeCpuBackend  # noqa: E402

SEQ, VOCAB = 16, 64


def _gpt2() -> object:
    return transformers.GPT2Model(transformers.GPT2Config(
        n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB, n_positions=64))


def _bert() -> object:
    return transformers.BertModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=64))


def _llama() -> object:
    return transformers.LlamaModel(transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64))


MODELS: dict[str, tuple[Callable[[], object], dict[str, object]]] = {
    "gpt2": (_gpt2, {"use_cache": False}), "bert": (_bert, {}),
    "llama": (_llama, {"use_cache": False})}


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Path:
    make, kwargs = MODELS[request.param]
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, VOCAB, (1, SEQ))
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    path = tmp_path_factory.mktemp(request.param) / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), str(path), kwargs={"attention_mask": mask, **kwargs},
                          dynamo=True, input_names=["input_ids", "attention_mask"],
                          external_data=False)
    return path


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("padded", [False, True], ids=["ones", "padded"])
def test_native_agrees_with_ort(exported: Path, padded: bool) -> None:
    rng = np.random.default_rng(1)
    mask = np.ones((1, SEQ), np.int64)
    if padded:
        mask[0, SEQ - 5:] = 0  # the last five tokens are padding
    feeds = {"input_ids": rng.integers(0, VOCAB, (1, SEQ)).astype(np.int64),
             "attention_mask": mask}
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    reference = dict(zip([o.name for o in session.get_outputs()],
                         session.run(None, feeds), strict=True))
    native = NativeCpuBackend(1)
    native.prepare(exported)
    got = native.run(feeds)
    assert set(got) == set(reference)
    for name, want in reference.items():
        assert got[name].shape == want.shape, name
        assert _cosine(got[name], want) >= 0.9999, name
        np.testing.assert_allclose(got[name], want, rtol=1e-3, atol=1e-4, err_msg=name)
