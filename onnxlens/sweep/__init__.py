"""Sweeps: many models x batches x precisions x targets (estimates and measurements), run by
a local process pool or on a Ray cluster, into DIR/results.jsonl, results.csv and report.html.
See README "Sweeps and clusters"; `onnxlens sweep SPEC.toml --out DIR` is the command."""

from .driver import Outcome, run_sweep
from .spec import SweepSpec, load_spec, parse_spec

__all__ = ["Outcome", "SweepSpec", "load_spec", "parse_spec", "run_sweep"]
