"""How fast is `analyze`? Ours against onnx-tool, growth with node count, the whole command.

    python benchmarks/analyze_speed.py            # full run (about 10 minutes)
    python benchmarks/analyze_speed.py --quick    # 3 runs, generated graphs up to 10k nodes
    python benchmarks/analyze_speed.py --nodes 50000 --runs 5
    python benchmarks/analyze_speed.py --command-only --base 452c7da   # (c) only, A/B
    python benchmarks/analyze_speed.py --command-only --json --base 452c7da   # ... with --json

Everything is measured in one run, so that ratios compare timings taken side by side on a
shared machine. Each figure is the median of several runs, min-max beside it; runs of the two
tools alternate (A B A B ...) so that a drift in machine speed hits both. Wall time is what a
user waits; CPU time (user + system of the process) is also printed because it moves less when
other jobs share the machine.

(a) `onnxlens.analyze(path)` against onnx-tool's `model_profile` (its shape inference, per-node
    MACs/params/memory and its table, printed to a discarded stream) on torchvision resnet50
    and vit_b_16, exported once into the cache folder. onnx-tool runs in a forked child, each
    run stopped after `--onnx-tool-timeout`.
(b) Ours on generated chains of Conv/Relu/Add blocks of growing size: time per node should stay
    flat. onnx-tool only up to 10,000 nodes: its time grows with the square of the node count.
(c) The `analyze` command on the largest generated graph as a subprocess, interpreter start
    included, and the packages it imports (`python -X importtime`): torch must not be one.
    With `--base REV`, REV's `analyze` runs alternated with this tree's, one warm-up each, and
    the ratio is taken pair by pair.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import gc
import importlib.util
import io
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import onnx
import onnx_tool
from chain import chain_model

import onnxlens

MODELS = ("resnet50", "vit_b_16")
SIZES = (5_000, 10_000, 25_000, 50_000)
ONNX_TOOL_MAX_NODES = 10_000  # onnx-tool runs on the generated graphs up to this many nodes
# Packages `analyze x.onnx` has no use for: importing one costs a second or more of start-up.
HEAVY = ("torch", "torchvision", "onnxruntime", "onnx_tool", "pandas", "scipy", "sympy",
         "matplotlib", "playwright")

Timing = tuple[float, float]  # (wall seconds, CPU seconds) of one run


@dataclass(frozen=True)
class Stats:
    """Timings of several runs; `stopped` runs ran past the time limit and are not in `runs`."""

    runs: tuple[Timing, ...]
    stopped: int = 0

    @property
    def wall(self) -> float:
        return statistics.median(w for w, _ in self.runs) if self.runs else float("nan")

    @property
    def cpu(self) -> float:
        return statistics.median(c for _, c in self.runs) if self.runs else float("nan")

    def cell(self) -> str:
        return f"{self.wall:7.3f} s" if self.runs else "  > limit"

    def spread(self) -> str:
        if not self.runs:
            return f"all {self.stopped} run(s) stopped"
        walls = [w for w, _ in self.runs]
        text = f"{min(walls):.3f}-{max(walls):.3f} (n={len(walls)}, cpu {self.cpu:.3f})"
        return text + (f", {self.stopped} stopped" if self.stopped else "")


# ---- models ---------------------------------------------------------------------------------
def chain_file(nodes: int, cache: Path) -> Path:
    path = cache / f"gen{_label(nodes)}.onnx"
    if not path.exists():
        onnx.save(chain_model(nodes), path)
    return path


def torchvision_file(name: str, cache: Path) -> Path:
    path = cache / f"{name}.onnx"
    if not path.exists():
        import torch
        import torchvision

        from onnxlens.exporters.torch_export import export_module

        print(f"exporting {name} to {path} (once) ...", flush=True)
        export_module(torchvision.models.get_model(name, weights=None),
                      (torch.randn(1, 3, 224, 224),), path)
    return path


def _label(nodes: int) -> str:
    return f"{nodes // 1000}k" if nodes % 1000 == 0 else str(nodes)


def _node_count(path: Path) -> int:
    return len(onnx.load(str(path), load_external_data=False).graph.node)


# ---- timing ---------------------------------------------------------------------------------
def ours(path: Path) -> Timing:
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    onnxlens.analyze(path)
    return time.perf_counter() - wall, time.process_time() - cpu


def _onnx_tool_child(path: str, conn: Connection) -> None:
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wall, cpu = time.perf_counter(), time.process_time()
        onnx_tool.model_profile(path)
        conn.send((time.perf_counter() - wall, time.process_time() - cpu))


def onnx_tool_run(path: Path, timeout: float) -> Timing | None:
    """onnx-tool's `model_profile`, timed inside a forked child (imports already done); None
    when it ran past `timeout` and was stopped."""
    parent, child = mp.Pipe(duplex=False)
    proc = mp.get_context("fork").Process(target=_onnx_tool_child, args=(str(path), child))
    proc.start()
    child.close()
    try:
        if parent.poll(timeout):
            return parent.recv()
        proc.terminate()
        return None
    finally:
        proc.join()
        parent.close()


def interleaved(fns: Sequence[Callable[[], Timing | None]], runs: int) -> list[Stats]:
    """Run each function `runs` times, round-robin (A B A B ...)."""
    timings: list[list[Timing]] = [[] for _ in fns]
    stopped = [0] * len(fns)
    for _ in range(runs):
        for i, fn in enumerate(fns):
            t = fn()
            if t is None:
                stopped[i] += 1
            else:
                timings[i].append(t)
    return [Stats(tuple(t), s) for t, s in zip(timings, stopped, strict=True)]


def _cli() -> list[str]:
    exe = shutil.which("analyze")
    if exe:
        return [exe]
    return [sys.executable, "-c", "from onnxlens.cli import analyze_main; analyze_main()"]


def base_cli(revision: str, into: Path) -> list[str]:
    """`analyze` as `revision` had it: its package from `git archive` (laid out as
    estimate_identity.py does), bytecode compiled, run by a launcher file as the console script
    runs `analyze_main` (so that it ends the program as the script does)."""
    from estimate_identity import _package_of

    package = _package_of(revision, into)
    compileall.compile_dir(package, quiet=1)
    launcher = into / "analyze_base.py"
    launcher.write_text(
        "import sys\n"
        "# the editable install's finder maps onnxlens to the working tree, whatever sys.path\n"
        "sys.meta_path[:] = [f for f in sys.meta_path\n"
        "                    if not type(f).__module__.startswith('_editable')]\n"
        f"sys.path.insert(0, {str(package)!r})\n"
        "from onnxlens.cli import analyze_main\n"
        "analyze_main()\n")
    return [sys.executable, str(launcher)]


def compile_sources() -> None:
    """Bytecode of onnxlens as an install leaves it. Where PYTHONDONTWRITEBYTECODE is set (this
    machine's shell), each `analyze` process would otherwise compile every module changed since
    the last install, which a user's `analyze` does not do."""
    for package in ("onnxlens", "onnxlens.analyzer", "onnxlens.reports"):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None, package
        compileall.compile_dir(Path(spec.origin).parent, quiet=1)


def cli_run(cli: Sequence[str], path: Path, options: Sequence[str] = ()) -> Timing:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    subprocess.run([*cli, str(path), *options], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def import_report(path: Path) -> tuple[list[tuple[str, float]], float]:
    """Seconds `analyze PATH` spends importing each top-level package (the sum of its modules'
    own times, from ``python -X importtime``), largest first, and the total."""
    code = ("import sys; sys.argv = ['analyze', sys.argv[1]]\n"
            "from onnxlens.cli import analyze_main; analyze_main()")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code, str(path)],
                          check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    per_package: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if not line.startswith("import time:") or len(fields) != 3 \
                or not fields[0].strip().isdigit():
            continue  # the header, or something else on stderr
        root = fields[2].strip().split(".")[0]
        per_package[root] = per_package.get(root, 0.0) + int(fields[0]) / 1e6
    ranked = sorted(per_package.items(), key=lambda kv: kv[1], reverse=True)
    return ranked, sum(per_package.values())


# ---- report ---------------------------------------------------------------------------------
def compare_models(cache: Path, runs: int, limit: float) -> None:
    print("(a) full analysis: onnxlens.analyze(path) vs onnx_tool.model_profile(path)")
    print(f"{'model':<10} {'nodes':>6} {'onnxlens':>9} {'onnx-tool':>9} {'ratio':>6} "
          f"{'cpu ratio':>9}   spread: ours; onnx-tool")
    for name in MODELS:
        path = torchvision_file(name, cache)
        path.read_bytes()  # into the page cache, for whichever tool runs first
        a, b = interleaved([lambda path=path: ours(path),
                            lambda path=path: onnx_tool_run(path, limit)], runs)
        print(f"{name:<10} {_node_count(path):>6} {a.cell()} {b.cell()} "
              f"{b.wall / a.wall:5.1f}x {b.cpu / a.cpu:8.1f}x   {a.spread()}; {b.spread()}")
    print("  ratio = onnx-tool time / ours (above 1: ours is faster)")


def growth(cache: Path, sizes: Sequence[int], runs: int, limit: float) -> None:
    print("\n(b) growth with node count: chain of Conv3x3/Relu/Add blocks, 8 channels, 8x8")
    print(f"{'graph':<8} {'nodes':>6} {'onnxlens':>9} {'cpu/node':>9} {'onnx-tool':>9} "
          f"{'cpu/node':>9}   spread: ours; onnx-tool")
    for n in sizes:
        path = chain_file(n, cache)
        nodes = _node_count(path)
        fns: list[Callable[[], Timing | None]] = [lambda path=path: ours(path)]
        if n <= ONNX_TOOL_MAX_NODES:
            fns.append(lambda path=path: onnx_tool_run(path, limit))
        # onnx-tool takes many seconds a run from 10k nodes on: at most 3 of its runs there.
        stats = interleaved(fns, runs if n < ONNX_TOOL_MAX_NODES or len(fns) == 1
                            else min(runs, 3))
        cells = [f"{s.cell()} {_per_node(s, nodes)}" for s in stats]
        if len(stats) == 1:
            cells.append(f"{'-':>9} {'':>9}")
        print(f"gen{_label(n):<5} {nodes:>6} {' '.join(cells)}   "
              + "; ".join(s.spread() for s in stats))
    print(f"  cpu/node: CPU time per node; flat means linear. onnx-tool only up to "
          f"{ONNX_TOOL_MAX_NODES:,} nodes (50,000 take minutes), each run stopped after "
          f"{limit:.0f} s")


def _per_node(stats: Stats, nodes: int) -> str:
    return f"{1e6 * stats.cpu / nodes:6.0f} us" if stats.runs else f"{'':>9}"


def whole_command(path: Path, runs: int, base: tuple[str, list[str]] | None = None,
                  options: Sequence[str] = ()) -> bool:
    """Prints the CLI's wall time (`options` after the model) and imports, and with `base`
    (revision, its command) the revision's alternated with it; False when it imported torch."""
    shown = " ".join([path.name, *options])
    print(f"\n(c) the whole command `analyze {shown}` as a subprocess, interpreter start "
          "included")
    fns = [lambda cli=cli: cli_run(cli, path, options)
           for cli in [_cli()] + ([base[1]] if base else [])]
    for fn in fns:
        fn()  # warm-up: the model in the page cache, each tree's bytecode read once
    stats = interleaved(fns, runs)
    c = stats[0]
    print(f"wall {c.wall:.3f} s median, {c.spread()}")
    if base:
        b = stats[1]
        ratio = Stats(tuple((x[0] / y[0], x[1] / y[1])
                            for x, y in zip(c.runs, b.runs, strict=True)))
        walls = [r for r, _ in ratio.runs]
        print(f"{base[0]}: wall {b.wall:.3f} s median, {b.spread()}; this tree / {base[0]}, "
              f"pair by pair: wall {ratio.wall:.2f} ({min(walls):.2f}-{max(walls):.2f}), "
              f"cpu {ratio.cpu:.2f}")
    ranked, total = import_report(path)
    heavy = [name for name, _ in ranked if name in HEAVY]
    print(f"imports: {total:.3f} s in all; the slowest packages: "
          + ", ".join(f"{name} {sec:.3f} s" for name, sec in ranked[:6]))
    print("heavy packages imported: " + (", ".join(heavy) if heavy else "none")
          + f" (looked for: {', '.join(HEAVY)})")
    return "torch" not in heavy


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="3 runs; generated graphs up to 10k nodes unless --nodes is given")
    p.add_argument("--nodes", type=int, default=None,
                   help="largest generated graph (default 50000; 10000 with --quick)")
    p.add_argument("--runs", type=int, default=None, help="timed runs per figure (default 5)")
    p.add_argument("--onnx-tool-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="stop one onnx-tool run after this long (default 120)")
    p.add_argument("--cache", type=Path, default=Path(__file__).parent / ".cache",
                   help="folder for the exported and generated models")
    p.add_argument("--command-only", action="store_true",
                   help="only (c), the whole command on the largest generated graph")
    p.add_argument("--base", metavar="REV",
                   help="(c) also times REV's analyze, alternated with this tree's")
    p.add_argument("--json", action="store_true",
                   help="(c) times `analyze MODEL --json FILE` (into a temporary folder)")
    args = p.parse_args(argv)
    runs = args.runs or (3 if args.quick else 5)
    largest = args.nodes or (10_000 if args.quick else 50_000)
    sizes = sorted({n for n in SIZES if n < largest} | {largest})
    args.cache.mkdir(parents=True, exist_ok=True)
    compile_sources()

    print(f"analyze speed: onnxlens {onnxlens.__version__}, onnx-tool {onnx_tool.VERSION}, "
          f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; median of {runs} runs, min-max after it\n")
    if not args.command_only:
        ours(chain_file(min(sizes), args.cache))  # warm-up: our lazy imports
        compare_models(args.cache, runs, args.onnx_tool_timeout)
        growth(args.cache, sizes, runs, args.onnx_tool_timeout)
    with tempfile.TemporaryDirectory() as tmp:
        base = (args.base, base_cli(args.base, Path(tmp))) if args.base else None
        options = ["--json", str(Path(tmp) / "out.json")] if args.json else []
        torch_free = whole_command(chain_file(largest, args.cache), runs, base, options)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0 if torch_free else 1


if __name__ == "__main__":
    sys.exit(main())
