"""How tests/data/genai was made: onnxruntime-genai's model builder run on a tiny Llama with
random weights, saved locally (no download). Re-run with onnxruntime-genai installed (it needs
`pip install --no-deps onnxruntime-genai`: its wheel asks for the CPU onnxruntime, which would
shadow onnxruntime-gpu), from the repository root:

    python tests/data/genai/make.py

Llama: 2 layers, hidden 32, 2 query heads and 1 KV head of 16 (ORT's CPU GroupQueryAttention
wants a head size that is a multiple of 16), MLP 64, vocabulary 64.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

HERE = Path(__file__).parent
CONFIG = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, max_position_embeddings=128)


def build(config: transformers.PretrainedConfig, target: Path,
          precisions: tuple[str, ...] = ("fp32", "int4")) -> None:
    """The model builder's decoder of a random-weights causal LM `config` (a Llama, a
    Qwen2, ...), one folder per precision under `target` (model.onnx, model.onnx.data,
    genai_config.json)."""
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(hf)
        # The builder copies a tokenizer beside the model: a word-level one of the vocabulary.
        vocab = {f"t{i}": i for i in range(config.vocab_size)}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0",
                                             bos_token="t1", eos_token="t2").save_pretrained(hf)
        for precision in precisions:
            out = Path(tmp) / precision
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i",
                            str(hf), "-o", str(out), "-p", precision, "-e", "cpu", "-c",
                            str(Path(tmp) / "cache")], check=True)
            (target / precision).mkdir(parents=True, exist_ok=True)
            for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
                shutil.copy(out / name, target / precision / name)


def main() -> None:
    build(CONFIG, HERE)


if __name__ == "__main__":
    main()
