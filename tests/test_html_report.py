"""The HTML report, opened in real headless Chromium: no console errors, no request leaves the
page, the sections are there, hostile names stay text, and it is interactive quickly.

Needs Debian's chromium (installed by .ci/run) and the playwright package (its driver only;
it uses /usr/bin/chromium, downloads nothing). Screenshots go to the test's output folder.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

import onnxlens
from onnxlens.reports.html import esc, load_analysis_json, render_html, write_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
XSS = "<img src=x onerror=alert(1)>"
HW = Path(__file__).parent / "data" / "test_gpu.toml"


def _open(page_path: Path, screenshot: Path) -> dict:
    """Load the page; return console errors, requests, timings and the visible text."""
    return open_in_chromium(page_path, screenshot, _use_groups_table)


def open_in_chromium(page_path: Path, screenshot: Path, use: Any, width: int = 1280) -> dict:
    """Load the page in headless Chromium, `width` px wide, let `use(page, start)` work it and
    return what it found, with the console errors, requests, dialogs, visible text and images
    in it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": width, "height": 900})
        errors: list[str] = []
        requests: list[str] = []
        dialogs: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        start = time.perf_counter()
        page.goto(page_path.as_uri(), wait_until="load")
        found = use(page, start)
        page.screenshot(path=str(screenshot), full_page=False)
        text = page.inner_text("body")
        images = page.eval_on_selector_all("main img", "is => is.length")
        browser.close()
    return {"errors": errors, "requests": requests, "text": text, "dialogs": dialogs,
            "images": images, **found}


def _use_groups_table(page: Any, start: float) -> dict:
    """Wait for the groups table, then sort it by FLOPs and filter it."""
    page.wait_for_selector("#groups-table th")
    ready_s = time.perf_counter() - start
    # Interactive: sorting by FLOPs puts the largest group first.
    page.click("#groups-table th:nth-child(6)")
    page.click("#groups-table th:nth-child(6)")
    first_flops = page.eval_on_selector("#groups-table tbody tr td:nth-child(6)",
                                        "c => parseFloat(c.getAttribute('data-v'))")
    page.fill("#filter", "zzz-no-such-group")
    visible = page.eval_on_selector_all("#groups-table tbody tr",
                                        "rs => rs.filter(r => r.style.display !== 'none')"
                                        ".length")
    page.fill("#filter", "")
    return {"ready_s": ready_s, "first_flops": first_flops, "visible_after_filter": visible}


def _check(result: dict, page_path: Path, d: dict) -> None:
    assert result["errors"] == []
    assert result["requests"] == [page_path.as_uri()]  # the page itself, nothing else
    assert result["dialogs"] == []
    for section in ("At a glance", "Fused groups", "Graph of groups"):
        assert section in result["text"]
    assert result["first_flops"] == max(g["flops"] for g in d["groups"])
    assert result["visible_after_filter"] == 0


@pytest.fixture(scope="module")
def resnet18_report(resnet18_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    out = tmp_path_factory.mktemp("report")
    d = onnxlens.analyze(resnet18_path, hardware=[str(HW)], batch=[1, 8],
                         precision=["fp32", "fp16"]).to_dict()
    return write_html(d, out / "resnet18.html"), d


def test_report_is_self_contained(resnet18_report: tuple) -> None:
    path, d = resnet18_report
    text = path.read_text()
    assert "http://" not in text and "https://" not in text
    assert "<script src" not in text and "<link" not in text
    assert "Roofline: test_gpu" in text and "Hardware comparison" in text
    assert text.count("<circle") >= len(d["groups"]) - 5  # one estimated point per group


@needs_chromium
def test_resnet18_report_in_chromium(resnet18_report: tuple) -> None:
    path, d = resnet18_report
    result = _open(path, path.with_suffix(".png"))
    _check(result, path, d)
    assert "Roofline: test_gpu" in result["text"]
    assert path.with_suffix(".png").stat().st_size > 10_000


def _transformer(tmp: Path) -> Path:
    import torch

    from onnxlens.exporters.torch_export import export_module

    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                             batch_first=True)
    return export_module(layer, (torch.randn(1, 16, 64),), tmp / "block.onnx")


@needs_chromium
def test_transformer_report_in_chromium(tmp_path: Path) -> None:
    d = onnxlens.analyze(_transformer(tmp_path), hardware=[str(HW)]).to_dict()
    path = write_html(d, tmp_path / "block.html")
    _check(_open(path, tmp_path / "block.png"), path, d)


def _hostile_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info(XSS, TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    nodes = [helper.make_node("Relu", [XSS], ["r"], name=XSS),
             helper.make_node("Relu", ["r"], ["y"], name="</script><script>alert(2)</script>")]
    graph = helper.make_graph(nodes, "<b>g</b>", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_hostile_strings_are_escaped_in_the_source() -> None:
    text = render_html(onnxlens.analyze(_hostile_model()).to_dict())
    assert XSS not in text and "<script>alert(2)" not in text
    assert esc(XSS) in text


@needs_chromium
def test_hostile_names_show_as_text_in_chromium(tmp_path: Path) -> None:
    d = onnxlens.analyze(_hostile_model()).to_dict()
    path = write_html(d, tmp_path / "xss.html")
    result = _open(path, tmp_path / "xss.png")
    assert result["dialogs"] == [] and result["images"] == 0
    assert XSS in result["text"]  # shown, as text
    assert result["errors"] == []


@needs_chromium
@pytest.mark.slow
def test_vit_report_opens(tmp_path: Path) -> None:
    import torch
    import torchvision

    from onnxlens.exporters.torch_export import export_module

    model = export_module(torchvision.models.vit_b_16(weights=None),
                          (torch.randn(1, 3, 224, 224),), tmp_path / "vit.onnx")
    d = onnxlens.analyze(model, hardware=[str(HW)]).to_dict()
    assert len(d["nodes"]) > 700  # 722 with the exporter's constant folding (1,000+ without)
    path = write_html(d, tmp_path / "vit.html")
    assert path.stat().st_size < 5 * 1024 * 1024
    result = _open(path, tmp_path / "vit.png")
    assert result["errors"] == [] and result["first_flops"] == max(
        g["flops"] for g in d["groups"])  # sorted: the page is interactive
    # How fast it opens is measured by benchmarks/report_open.py, not asserted here.


def test_report_command_from_saved_json(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from onnxlens.cli import app

    saved = tmp_path / "a.json"
    saved.write_text(json.dumps(onnxlens.analyze(_hostile_model()).to_dict()))
    out = CliRunner().invoke(app, ["report", str(saved), "-o", str(tmp_path / "a.html")])
    assert out.exit_code == 0, out.output
    assert load_analysis_json(saved)["schema"] == "onnxlens/1"
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    out = CliRunner().invoke(app, ["report", str(bad), "-o", str(tmp_path / "b.html")])
    assert out.exit_code != 0 and "not an onnxlens analysis" in out.output


def test_netron_attachment(resnet18_path: Path, tmp_path: Path) -> None:
    from onnxlens.reports.netron import write_netron_attachment

    d = onnxlens.analyze(resnet18_path, hardware=[str(HW)]).to_dict()
    data = json.loads(write_netron_attachment(d, tmp_path / "r.attachment.json").read_text())
    assert data["signature"] == "netron:attachment"
    conv = {e["name"]: e["value"] for e in data["metrics"]
            if e["kind"] == "node" and e["target"] == "/conv1/Conv"}
    assert conv["macs"] == 64 * 112 * 112 * 3 * 7 * 7
    names = {n.name for n in onnx.load(resnet18_path).graph.node}
    assert {e["target"] for e in data["metrics"] if e["kind"] == "node"} <= names
    model = {e["name"]: e["value"] for e in data["metrics"] if e["kind"] == "model"}
    assert model["macs"] == d["totals"]["macs"]


@needs_chromium
def test_report_of_ten_thousand_nodes_opens(tmp_path: Path) -> None:
    """Bigger than any torchvision model: a 10,000-node Conv/Relu/Add chain."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    from chain import chain_model

    d = onnxlens.analyze(chain_model(10_000), hardware=[str(HW)]).to_dict()
    path = write_html(d, tmp_path / "chain.html")
    assert path.stat().st_size < 5 * 1024 * 1024
    result = _open(path, tmp_path / "chain.png")
    assert result["errors"] == [] and result["visible_after_filter"] == 0


def test_spread_moves_labels_apart_in_order() -> None:
    from onnxlens.reports.html import spread

    # 102 is within 13 of 100: pushed to 113; the others keep their place.
    assert spread([100, 102, 50, 300], 13, top=23, bottom=310) == [100, 113, 50, 300]
    # Pushed past the bottom: the lowest sits on it, the one above 13 higher.
    assert spread([300, 305], 13, top=23, bottom=310) == [297, 310]
    assert spread([5, 5], 13, top=23, bottom=310) == [23, 36]  # equal: order kept


@pytest.fixture(scope="module")
def measured_report(resnet18_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ResNet-18 measured on ort-cpu, estimated on a profile whose L2 and HBM bandwidths are
    10% apart (3300 and 3000 GB/s): every column of the groups table, the validation table,
    and two roofs whose labels would fall on one another."""
    from onnxlens.backends.compare import attach_measurements, compare
    from onnxlens.exporters.torch_export import _provenance

    out = tmp_path_factory.mktemp("measured")
    # The published figures `analyze resnet18` records: the validation table's rows.
    model = onnx.load(resnet18_path)
    helper.set_model_props(model, _provenance("resnet18", 224))
    resnet18_path = out / "resnet18.onnx"
    onnx.save(model, resnet18_path)
    close = out / "close_levels.toml"
    close.write_text(HW.read_text().replace("bandwidth_gbps = 6000.0", "bandwidth_gbps = 3300.0")
                     .replace('name = "Test GPU', 'name = "Close levels GPU'))
    result = onnxlens.analyze(resnet18_path, hardware=[str(close)])
    comparison = compare(resnet18_path, ["ort-cpu"], analysis=result, runs=3, warmup=1,
                         profile_runs=2, samples=1, memory=False)
    d = attach_measurements(result.to_dict(), comparison.to_dict())
    assert {lv["bandwidth_gbps"] for lv in d["hardware"]["close_levels"]["memory"]} == {
        3300.0, 3000.0}
    return write_html(d, out / "measured.html")


def _tables_and_labels(page: Any, start: float) -> dict:
    """Each table's width against its scroll container, and the roofline labels' boxes, each
    scrolled into view first (sections off screen are not laid out: content-visibility)."""
    tables, labels = [], []
    for i in range(page.locator("main table").count()):
        table = page.locator("main table").nth(i)
        table.scroll_into_view_if_needed()
        tables.append(table.evaluate("""t => {const c = t.closest('div.scroll') || t.parentElement;
            return {table: t.id || t.className, head: t.tHead ? t.tHead.textContent : '',
                    right: t.getBoundingClientRect().right,
                    container_right: c.getBoundingClientRect().right, scroll: c.scrollWidth,
                    client: c.clientWidth, overflow: getComputedStyle(c).overflowX};}"""))
    for i in range(page.locator("section[id^=roofline] svg.chart").count()):
        chart = page.locator("section[id^=roofline] svg.chart").nth(i)
        chart.scroll_into_view_if_needed()
        labels.append(chart.evaluate("""svg => Array.from(svg.querySelectorAll('text[fill]'))
            .map(t => {const b = t.getBBox();
                       return {text: t.textContent, x: b.x, y: b.y, w: b.width, h: b.height};})
            """))
    page_width = page.evaluate("() => [document.documentElement.scrollWidth, innerWidth]")
    return {"tables": tables, "labels": labels, "page_width": page_width}


def _overlap(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


@needs_chromium
def test_tables_fit_and_roof_labels_apart_at_1400_px(measured_report: Path) -> None:
    result = open_in_chromium(measured_report, measured_report.with_suffix(".png"),
                              _tables_and_labels, width=1400)
    assert result["errors"] == []
    names = [t["table"] for t in result["tables"]]
    assert "groups-table" in names and len(names) >= 4  # glance, groups, backends, validation
    heads = " ".join(t["head"] for t in result["tables"])
    assert "why they differ" in heads and "bound" in heads and "est/meas" in heads
    for t in result["tables"]:  # nothing clipped: every table fits inside its container
        assert t["scroll"] <= t["client"] and t["right"] <= t["container_right"] + 0.5, t
    width, viewport = result["page_width"]
    assert width <= viewport  # nor does the page itself scroll sideways
    (labels,) = result["labels"]
    assert [lb["text"] for lb in labels] == ["L2 3300 GB/s", "HBM 3000 GB/s"]
    assert not _overlap(*labels), labels


@needs_chromium
def test_wide_tables_scroll_in_their_own_container(measured_report: Path) -> None:
    """At 700 px the groups table cannot fit: its own container scrolls, not the page."""
    result = open_in_chromium(measured_report, measured_report.with_suffix(".700.png"),
                              _tables_and_labels, width=700)
    (groups,) = [t for t in result["tables"] if t["table"] == "groups-table"]
    assert groups["scroll"] > groups["client"] and groups["overflow"] == "auto"
    width, viewport = result["page_width"]
    assert width <= viewport
