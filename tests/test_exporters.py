"""Exporters: names, module:factory, the cache, BatchNorm kept or folded, dynamic batch."""

from __future__ import annotations

import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from onnxlens.analyzer.errors import ExportError
from onnxlens.exporters import torch_export
from onnxlens.exporters.torch_export import (
    cache_dir,
    cache_path,
    cached_export,
    default_image_size,
    export_model,
    export_module,
    resolve_name,
)

FACTORY_SOURCE = '''
import collections

import torch
from torch import nn

Pair = collections.namedtuple("Pair", ["logits", "features"])


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        f = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.fc(f)


class TwoHeads(Tiny):
    def forward(self, x):
        f = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return Pair(self.fc(f), f)


class ShapeArithmetic(nn.Module):
    """x.shape feeding expand(n, -1, -1), a computed pad and a reshape, as ViT and Swin do."""

    def __init__(self):
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, 3))
        self.proj = nn.Linear(3, 5)

    def forward(self, x):
        n, c, h, w = x.shape
        pad = (4 - w % 4) % 4
        x = torch.nn.functional.pad(x, (0, pad, 0, pad))
        seq = x.reshape(n, c, -1).transpose(1, 2)
        seq = torch.cat([self.token.expand(n, -1, -1), seq], dim=1)
        return self.proj(seq).softmax(-1)


def tiny():
    return Tiny()


def two_heads():
    return TwoHeads()


def shape_arithmetic():
    return ShapeArithmetic()


def not_a_module():
    return 42


def token_ids():
    return nn.Embedding(16, 4)
'''


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module `onnxlens_test_factories` importable from sys.path; returns its name."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "onnxlens_test_factories.py").write_text(textwrap.dedent(FACTORY_SOURCE))
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.delitem(sys.modules, "onnxlens_test_factories", raising=False)  # earlier test's
    return "onnxlens_test_factories"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("ONNXLENS_CACHE", str(root))
    return root


def op_counts(path: Path) -> Counter[str]:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def initializer_elements(path: Path) -> int:
    return sum(int(np.prod(t.dims)) for t in onnx.load(str(path)).graph.initializer)


# ---- names -----------------------------------------------------------------------------------

def test_names_resolve_case_insensitively() -> None:
    assert resolve_name("resnet18") == "resnet18"
    assert resolve_name("ResNet18") == "resnet18"
    assert resolve_name("ViT_B_16") == "vit_b_16"


@pytest.mark.parametrize(("name", "size"), [("resnet18", 224), ("inception_v3", 299),
                                            ("efficientnet_b7", 600), ("vit_h_14", 518),
                                            ("swin_v2_t", 256), ("regnet_y_128gf", 384)])
def test_default_image_size_is_the_weights_crop_size(name: str, size: int) -> None:
    assert default_image_size(name) == size


def test_unknown_name_is_one_line_with_suggestions(tmp_path: Path) -> None:
    with pytest.raises(ExportError) as info:
        export_model("resnet181", tmp_path / "x.onnx")
    message = str(info.value)
    assert "\n" not in message
    assert "'resnet181'" in message and "resnet18" in message and "did you mean" in message
    with pytest.raises(ExportError, match="lists them"):
        resolve_name("zzzzzz")


def test_unbuildable_size_is_an_export_error(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="vit_b_16 at image size 100"):
        export_model("vit_b_16", tmp_path / "x.onnx", image_size=100)


def test_bad_options_are_export_errors(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="batch"):
        export_model("resnet18", tmp_path / "x.onnx", batch=0)
    with pytest.raises(ExportError, match="image size"):
        export_model("resnet18", tmp_path / "x.onnx", image_size=0)


# ---- module:factory --------------------------------------------------------------------------

def test_module_factory_exports_at_224(factory_module: str, tmp_path: Path) -> None:
    path = export_model(f"{factory_module}:tiny", tmp_path / "tiny.onnx")
    model = onnx.load(str(path))
    assert [dims(i) for i in model.graph.input] == [[1, 3, 224, 224]]
    assert [o.name for o in model.graph.output] == ["output"]
    assert [dims(o) for o in model.graph.output] == [[1, 2]]


def test_module_factory_with_namedtuple_output(factory_module: str, tmp_path: Path) -> None:
    path = export_model(f"{factory_module}:two_heads", tmp_path / "two.onnx", image_size=16,
                        dynamic_batch=True)
    model = onnx.load(str(path))
    assert [o.name for o in model.graph.output] == ["output_0", "output_1"]
    assert [dims(o) for o in model.graph.output] == [["batch", 2], ["batch", 4]]


@pytest.mark.parametrize(("suffix", "match"), [
    (":not_a_module", "returned int, not a torch.nn.Module"),
    (":missing", "cannot load"),
    (":", "expected module:factory"),
])
def test_module_factory_errors(factory_module: str, tmp_path: Path, suffix: str,
                               match: str) -> None:
    with pytest.raises(ExportError, match=match):
        export_model(factory_module + suffix, tmp_path / "x.onnx")


def test_a_factory_wanting_other_inputs_is_told_what_it_was_fed(factory_module: str,
                                                                 tmp_path: Path) -> None:
    """An Embedding (a transformer's first layer) fed the export's float image fails inside
    torch; the one line says which input the export gave it and what to do instead."""
    with pytest.raises(ExportError, match=r"exporting Embedding to ONNX failed: .*Long.* \(onnx"
                       r"lens calls it on one float32 image \[1, 3, 224, 224\]; export a model "
                       r"with other inputs with torch.onnx.export and analyze the .onnx\)$"):
        export_model(f"{factory_module}:token_ids", tmp_path / "x.onnx")


def test_missing_factory_module(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="cannot load 'no_such_module_xyz:f'"):
        export_model("no_such_module_xyz:f", tmp_path / "x.onnx")


def test_big_weights_go_to_one_side_file(factory_module: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Over 2 GiB of weights (vit_h_14, regnet_y_128gf) protobuf cannot hold them in the file."""
    import onnxlens

    monkeypatch.setattr(torch_export, "EXTERNAL_DATA_BYTES", 100)
    out = tmp_path / "out" / "tiny.onnx"
    export_model(f"{factory_module}:tiny", out, image_size=8)
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny.onnx", "tiny.onnx.data"]
    assert onnxlens.analyze(out).totals["params"] == 3 * 4 * 9 + 4 + 4 * 2 + 2


# ---- the cache -------------------------------------------------------------------------------

def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ONNXLENS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "onnxlens"
    monkeypatch.setenv("ONNXLENS_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("ONNXLENS_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "onnxlens"


def test_cache_names_carry_every_option(cache: Path, factory_module: str) -> None:
    base = dict(batch=1, image_size=None, keep_batchnorm=False, opset=None)
    names = {cache_path("resnet18", **base).name,
             cache_path("resnet18", **{**base, "batch": 2}).name,
             cache_path("resnet18", **{**base, "image_size": 160}).name,
             cache_path("resnet18", **{**base, "keep_batchnorm": True}).name,
             cache_path("resnet18", **{**base, "opset": 18}).name,
             cache_path(f"{factory_module}:tiny", **base).name}
    assert len(names) == 6
    assert cache_path("ResNet18", **base) == cache_path("resnet18", **base)
    for name in names:
        assert all(c.isalnum() or c in "._-" for c in name), name


def test_cached_export_exports_once(cache: Path, factory_module: str,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    spec = f"{factory_module}:tiny"
    first = cached_export(spec, batch=2, image_size=32, keep_batchnorm=True, opset=None)
    assert first.parent == cache and first.is_file()
    assert "exporting" in capsys.readouterr().err
    assert [dims(i) for i in onnx.load(str(first)).graph.input] == [[2, 3, 32, 32]]
    assert op_counts(first)["BatchNormalization"] == 1
    assert [p.name for p in cache.iterdir()] == [first.name]  # no temporary left behind

    def must_not_export(*args: object, **kwargs: object) -> Path:
        raise AssertionError("exported again instead of using the cache")

    monkeypatch.setattr(torch_export, "export_model", must_not_export)
    mtime = first.stat().st_mtime_ns
    again = cached_export(spec, batch=2, image_size=32, keep_batchnorm=True, opset=None)
    assert again == first and first.stat().st_mtime_ns == mtime
    assert capsys.readouterr().err == ""


def test_editing_a_factory_exports_again(cache: Path, factory_module: str, tmp_path: Path) -> None:
    options = dict(batch=1, image_size=None, keep_batchnorm=False, opset=None)
    before = cache_path(f"{factory_module}:tiny", **options)
    source = tmp_path / "src" / f"{factory_module}.py"
    source.write_text(source.read_text() + "\n# edited\n")
    assert cache_path(f"{factory_module}:tiny", **options) != before


# ---- BatchNorm, dynamic batch, parameters, numerics -----------------------------------------

def test_batchnorm_kept_or_folded(resnet18_path: Path, resnet18_bn_path: Path) -> None:
    folded, kept = op_counts(resnet18_path), op_counts(resnet18_bn_path)
    assert folded["BatchNormalization"] == 0 and kept["BatchNormalization"] == 20
    assert folded["Identity"] == kept["Identity"] == 0
    assert folded["Conv"] == kept["Conv"] == 20


def test_resnet18_initializers_are_the_module_parameters(resnet18_path: Path,
                                                         resnet18_bn_path: Path) -> None:
    """Every parameter and buffer is its own initializer, however equal their random values.

    BN kept: the module's parameters plus each BN's running mean and variance.
    BN folded: each BN's gamma and beta become the bias of the (bias-free) Conv before it.
    """
    import torch
    import torchvision

    module = torchvision.models.resnet18(weights=None)
    params = sum(p.numel() for p in module.parameters())
    bns = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    bn_channels = sum(bn.num_features for bn in bns)
    assert (params, bn_channels) == (11_689_512, 4_800)
    assert all(m.bias is None for m in module.modules() if isinstance(m, torch.nn.Conv2d))
    assert initializer_elements(resnet18_bn_path) == params + 2 * bn_channels == 11_699_112
    assert initializer_elements(resnet18_path) == params - bn_channels == 11_684_712


def test_dynamic_batch_runs_at_any_batch(factory_module: str, tmp_path: Path) -> None:
    import onnxruntime as ort

    path = export_model(f"{factory_module}:tiny", tmp_path / "dyn.onnx", image_size=8,
                        dynamic_batch=True)
    model = onnx.load(str(path))
    assert dims(model.graph.input[0]) == ["batch", 3, 8, 8]
    assert dims(model.graph.output[0]) == ["batch", 2]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"input": np.zeros((5, 3, 8, 8), np.float32)})
    assert out.shape == (5, 2)


@pytest.mark.parametrize("dynamic_batch", [False, True])
def test_shape_arithmetic_folds_and_still_computes(factory_module: str, tmp_path: Path,
                                                   dynamic_batch: bool) -> None:
    """With static shapes the Shape plumbing folds away; the numbers stay torch's."""
    import importlib

    import onnxruntime as ort
    import torch

    import onnxlens

    module = importlib.import_module(factory_module).shape_arithmetic().eval()
    x = torch.randn(2, 3, 10, 10)
    path = export_module(module, (x,), tmp_path / "shapes.onnx", dynamic_batch=dynamic_batch)
    ops = op_counts(path)
    if dynamic_batch:
        assert ops["Shape"] >= 1  # n stays a runtime value
    else:
        assert ops["Shape"] == ops["Where"] == ops["ConstantOfShape"] == 0
        result = onnxlens.analyze(path)
        assert result.totals["complete"], result.warnings
        assert result.totals["macs"] == 2 * (1 + 12 * 12) * 3 * 5  # the Linear on 145 tokens
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in ([2, 3] if dynamic_batch else [2]):
        xb = torch.randn(batch, 3, 10, 10)
        with torch.no_grad():
            expected = module(xb).numpy()
        (got,) = session.run(None, {"input": xb.numpy()})
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_transformer_encoder_layer_exports(tmp_path: Path) -> None:
    """Its eval fast path (one fused aten op) and its bool `is_causal` default both break the
    TorchScript exporter; neither may leak into the user's module afterwards."""
    import onnxruntime as ort
    import torch

    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                             batch_first=True).eval()
    x = torch.randn(2, 8, 32)
    path = export_module(layer, (x,), tmp_path / "layer.onnx")
    assert "forward" not in layer.__dict__ and torch.backends.mha.get_fastpath_enabled()
    assert op_counts(path)["Softmax"] == 1
    with torch.no_grad():
        expected = layer(x).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input": x.numpy()})
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("keep_batchnorm", [False, True])
def test_resnet18_matches_torch_under_onnxruntime(tmp_path: Path, keep_batchnorm: bool) -> None:
    import onnxruntime as ort
    import torch
    import torchvision

    torch.manual_seed(0)
    module = torchvision.models.resnet18(weights=None).eval()
    with torch.no_grad():  # non-trivial BN statistics, so folding has something to get wrong
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 3, 224, 224)
    path = export_module(module, (x,), tmp_path / "r18.onnx", keep_batchnorm=keep_batchnorm)
    with torch.no_grad():
        expected = module(x).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input": x.numpy()})
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


# ---- the CLI ---------------------------------------------------------------------------------

def test_cli_export(factory_module: str, tmp_path: Path) -> None:
    from onnxlens.cli import app

    out = tmp_path / "cli.onnx"
    result = CliRunner().invoke(app, ["export", f"{factory_module}:tiny", "-o", str(out),
                                      "--keep-batchnorm", "--batch", "3", "--image-size", "16",
                                      "--opset", "18", "--dynamic-batch"])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output
    model = onnx.load(str(out))
    assert dims(model.graph.input[0]) == ["batch", 3, 16, 16]
    assert op_counts(out)["BatchNormalization"] == 1
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {18}


def test_cli_export_unknown_name(tmp_path: Path) -> None:
    from onnxlens.cli import app

    result = CliRunner().invoke(app, ["export", "resnet181", "-o", str(tmp_path / "x.onnx")])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert "error: unknown model 'resnet181'" in result.output
    assert "did you mean" in result.output
