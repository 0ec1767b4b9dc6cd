"""How fast the HTML report opens in headless Chromium: vit_b_16 and a 10,000-node chain.

    python benchmarks/report_open.py [--runs 3]

Prints, per report, its size and the time from navigation until the groups table is ready
(median of runs), beside the same for the report of a 5-node model opened in the same run,
so that a loaded machine shows up as a slow baseline rather than as a slow report. Target:
vit_b_16 interactive in under 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import onnxlens  # noqa: E402
from onnxlens.reports.html import write_html  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
HW = HERE.parent / "tests" / "data" / "test_gpu.toml"


def reports(folder: Path) -> dict[str, Path]:
    import torch
    import torchvision
    from chain import chain_model

    from onnxlens.exporters.torch_export import export_module

    vit = export_module(torchvision.models.vit_b_16(weights=None),
                        (torch.randn(1, 3, 224, 224),), folder / "vit.onnx")
    sources = {"tiny (baseline)": chain_model(6), "vit_b_16": vit,
               "chain 10,000 nodes": chain_model(10_000)}
    return {name: write_html(onnxlens.analyze(src, hardware=[str(HW)]).to_dict(),
                             folder / f"{i}.html") for i, (name, src) in enumerate(sources.items())}


def ready_seconds(page, path: Path) -> float:
    start = time.perf_counter()
    page.goto(path.as_uri(), wait_until="domcontentloaded")
    page.wait_for_selector("#groups-table th")
    page.click("#groups-table th:nth-child(6)")  # interactive: a sort has run
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        pages = reports(Path(tmp))
        times: dict[str, list[float]] = {name: [] for name in pages}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            for _ in range(args.runs):  # interleaved, so load hits every report alike
                for name, path in pages.items():
                    page = browser.new_page()
                    times[name].append(ready_seconds(page, path))
                    page.close()
            browser.close()
        base = statistics.median(times["tiny (baseline)"])
        print(f"{'report':<20} {'size':>9} {'median s':>9} {'min s':>7} {'max s':>7} "
              f"{'x baseline':>10}")
        for name, path in pages.items():
            t = times[name]
            print(f"{name:<20} {path.stat().st_size / 1e6:>7.2f}MB {statistics.median(t):>9.2f}"
                  f" {min(t):>7.2f} {max(t):>7.2f} {statistics.median(t) / base:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
