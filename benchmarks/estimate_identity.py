"""Are the estimates of this tree bit for bit those of an earlier revision?

    python benchmarks/estimate_identity.py --base 5a6a2f7 resnet18 efficientnet_b0 ...

Builds the package of `--base` from `git archive` in a temporary folder (the analyzer needs no
native build), then estimates every model on each profile twice, one kernel per fused group and
as ONNX Runtime's CPU kernels (`analyzer.runtimes.ort_cpu`, at the profile's constant
efficiencies: no calibration needed), in a child process per tree. Prints, per row, whether the
model latency and every group's latency are identical (`repr` of the floats) or how they moved.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("analyzer", "reports", "backends", "exporters")


def estimates(models: list[str], profiles: list[str]) -> dict[str, list]:
    """In this process's onnxlens: model/profile/runtime -> [latency, (group, latency)...]."""
    from onnxlens.analyzer.analysis import analyze
    from onnxlens.analyzer.hardware import load_profile

    out: dict[str, list] = {}
    for model in models:
        result = analyze(model)
        for key in profiles:
            hw = load_profile(key)
            for runtime in (None, "ort-cpu"):
                if runtime is None:
                    profile = hw
                elif hasattr(hw, "runtime"):  # typed since 80a524a
                    from onnxlens.analyzer.hardware import Runtime

                    profile = dataclasses.replace(hw, runtime=Runtime(runtime))
                else:
                    profile = dataclasses.replace(hw, extra={**hw.extra, "runtime": runtime})
                e = result.estimate(profile)  # the graph's own: fp32, or a quantized model's
                out[f"{Path(model).name}/{key}/{runtime or 'per-group'}"] = [repr(e.latency_s)] + [
                    [g, repr(ge.latency_s)] for g, ge in sorted(e.groups.items()) if ge]
    return out


def _package_of(revision: str, into: Path) -> Path:
    """`revision`'s tree laid out as the installed package (onnxlens/, onnxlens/analyzer, ...)."""
    archive = into / "tree.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "archive", revision], cwd=ROOT, stdout=f, check=True)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    package = into / "pkg" / "onnxlens"
    package.parent.mkdir()
    (tree / "onnxlens").rename(package)
    for name in PACKAGES:
        (tree / name).rename(package / name)
    return package.parent


def _drop_editable_finders() -> None:
    """An editable install (scikit-build-core's) puts a finder ahead of sys.path that maps
    `onnxlens` to the working tree, whatever PYTHONPATH says: without this, the base's child
    imported this tree too, and every row compared the tree with itself."""
    sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable")]


def _run(models: list[str], profiles: list[str], path: Path | None) -> dict[str, list]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path:
        env["PYTHONPATH"] = str(path)
    done = subprocess.run([sys.executable, __file__, "--child", "--profiles", *profiles, "--",
                           *models], env=env, capture_output=True, text=True, check=True,
                          cwd=tempfile.gettempdir())
    out = json.loads(done.stdout)
    expected = (path or ROOT).resolve()
    if not Path(out["package"]).resolve().is_relative_to(expected):
        sys.exit(f"the child imported onnxlens from {out['package']}, not from {expected}")
    return out["estimates"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help=".onnx files or torchvision names")
    parser.add_argument("--base", default="HEAD", help="the revision to compare with")
    parser.add_argument("--profiles", nargs="+", default=["xeon_8480", "a100"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if os.environ.get("PYTHONPATH"):  # the base's package, not the editable install's
            _drop_editable_finders()
        import onnxlens

        print(json.dumps({"package": onnxlens.__file__,
                          "estimates": estimates(args.models, args.profiles)}))
        return
    from onnxlens.exporters.torch_export import cached_export

    # A torchvision name is exported here once (the children analyze files).
    models = [str(Path(m).resolve() if Path(m).exists() else cached_export(m))
              for m in args.models]
    with tempfile.TemporaryDirectory() as tmp:
        before = _run(models, args.profiles, _package_of(args.base, Path(tmp)))
    after = _run(models, args.profiles, None)
    same = 0
    for key, old in before.items():
        new = after.get(key)
        if new == old:
            same += 1
            print(f"{key:70s} identical")
        else:
            moved = f"{float(old[0]):.6g} s -> {float(new[0]):.6g} s" if new else "missing"
            print(f"{key:70s} DIFFERENT ({moved})")
    print(f"{same} of {len(before)} identical to {args.base}")


if __name__ == "__main__":
    main()
