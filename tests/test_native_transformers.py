"""The native executor runs Hugging Face transformers as torch's dynamo exporter writes them
(GPT-2, BERT, a grouped-query-attention Llama; random weights, 1-2 layers, hidden 32-64): the
causal and padding masks (IsNaN, Where, Expand), GatherND / GatherElements position and
pooler indexing, scalar-index Gather; every output agrees with ONNX Runtime to cosine
>= 0.9999, with a padded attention mask as well as an all-ones one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from hf_models import VOCAB, export  # noqa: E402

from onnxlens.backends.native_cpu import NativeCpuBackend  # noqa: E402

SEQ = 16


# (layers, hidden) of each model: GPT-2 and BERT with one layer, GQA Llama with two.
SIZES = {"gpt2": (1, 32), "bert": (1, 32), "llama": (2, 64)}


@pytest.fixture(scope="module", params=sorted(SIZES))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Path:
    layers, hidden = SIZES[request.param]
    return export(request.param, tmp_path_factory.mktemp(request.param) / "model.onnx",
                  layers=layers, hidden=hidden, seq=SEQ)


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
