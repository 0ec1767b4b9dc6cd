"""The sweep spec: a TOML file checked in full before any work starts.

    models = ["resnet18", "path/to/model.onnx", "pkg.module:factory"]
    batch = [1, 8]                  # an integer or a list
    precision = ["graph", "fp16"]   # of the estimates; a string or a list. "graph" (the
                                    # default): each model's own, what it is measured at;
                                    # fp32/fp16/bf16/int8: a what-if of an fp32 model
    hardware = ["host", "a100"]     # estimate targets (profile keys or .toml files)
    measure = ["ort-cpu"]           # measured backends, at the model's own precision
    threads = 1                     # of the host profile and of every measured backend
    runs = 20                       # timed runs per measured row
    warmup = 5                      # untimed runs before them

    [dims."path/to/model.onnx"]     # pin a model's symbolic input dims by name
    seq = 128

    [resources]                     # Ray: backend -> the custom resource its rows ask for
    ort-cuda = "a100"

Every error names the key at fault and is raised before anything is exported or run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analyzer.errors import UsageError
from ..analyzer.hardware import GRAPH

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class SweepSpec:
    models: tuple[str, ...]
    batch: tuple[int, ...] = (1,)
    precision: tuple[str, ...] = (GRAPH,)
    hardware: tuple[str, ...] = ()
    measure: tuple[str, ...] = ()
    threads: int = 1
    runs: int = 20
    warmup: int = 5
    dims: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> {dim: value}
    resources: dict[str, str] = field(default_factory=dict)  # backend -> Ray resource

    @property
    def rows_per_batch(self) -> int:
        """How many rows one model at one batch makes: its estimates and measurements."""
        return len(self.precision) * len(self.hardware) + len(self.measure)

    @property
    def rows(self) -> int:
        """How many rows the sweep makes in all."""
        return len(self.models) * len(self.batch) * self.rows_per_batch


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a spec file (module docstring)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such spec file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read the spec ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    return parse_spec(data)


def parse_spec(data: dict[str, Any]) -> SweepSpec:
    """A spec from its parsed TOML; `UsageError` naming the key on any unknown key, wrong type
    or value that cannot work (an unknown precision, hardware profile or backend)."""
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise UsageError(f"spec: unknown key {unknown[0]!r} (expected one of "
                         f"{', '.join(sorted(_KEYS))})")
    if "models" not in data:
        raise UsageError("spec: 'models' is missing: list the models to sweep")
    spec = SweepSpec(
        models=_strings(data, "models", ()),
        batch=_positive_ints(data, "batch", (1,)),
        precision=_strings(data, "precision", (GRAPH,)),
        hardware=_strings(data, "hardware", (), empty_ok=True),
        measure=_strings(data, "measure", (), empty_ok=True),
        threads=_positive_int(data, "threads", 1),
        runs=_positive_int(data, "runs", 20),
        warmup=_positive_int(data, "warmup", 5, minimum=0),
        dims=_dims(data.get("dims", {})),
        resources=_resources(data.get("resources", {})),
    )
    _check_names(spec)
    return spec


_KEYS = {"models", "batch", "precision", "hardware", "measure", "threads", "runs", "warmup",
         "dims", "resources"}


def _strings(data: dict[str, Any], key: str, default: tuple[str, ...], *,
             empty_ok: bool = False) -> tuple[str, ...]:
    value = data.get(key, default)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"spec: {key!r} must be a string or a list of non-empty strings, "
                         f"got {value!r}")
    if not value and not empty_ok:
        raise UsageError(f"spec: {key!r} is empty")
    if len(set(value)) != len(value):
        raise UsageError(f"spec: {key!r} names {_first_repeat(value)!r} twice")
    return tuple(value)


def _positive_ints(data: dict[str, Any], key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    value = data.get(key, default)
    values = [value] if _is_int(value) else value
    if not isinstance(values, list | tuple) or not values or not all(
            _is_int(v) and v >= 1 for v in values):
        raise UsageError(f"spec: {key!r} must be a positive integer or a list of them, "
                         f"got {value!r}")
    if len(set(values)) != len(values):
        raise UsageError(f"spec: {key!r} names {_first_repeat(values)!r} twice")
    return tuple(values)


def _positive_int(data: dict[str, Any], key: str, default: int, minimum: int = 1) -> int:
    value = data.get(key, default)
    if not _is_int(value) or value < minimum:
        raise UsageError(f"spec: {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # TOML true is no batch


def _first_repeat(values: list[Any]) -> Any:
    return next(v for i, v in enumerate(values) if v in values[:i])


def _dims(value: Any) -> dict[str, dict[str, int]]:
    if not isinstance(value, dict):
        raise UsageError(f"spec: 'dims' must be a table of models, got {value!r}")
    for model, pins in value.items():
        if not isinstance(pins, dict) or not all(
                isinstance(k, str) and _is_int(v) and v >= 0 for k, v in pins.items()):
            # 0 is legal, as with --dim: a prefill's empty KV cache (past_sequence_length = 0)
            raise UsageError(f"spec: 'dims.{model}' must map dim names to integers >= 0, "
                             f"got {pins!r}")
    return {m: dict(p) for m, p in value.items()}


def _resources(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
            isinstance(v, str) and v for v in value.values()):
        raise UsageError(f"spec: 'resources' must map backends to resource names, got {value!r}")
    return dict(value)


def _check_names(spec: SweepSpec) -> None:
    """Precisions, profiles and backends exist, and every dims/resources key is swept."""
    from ..analyzer.hardware import PRECISION_BYTES, available_profiles
    from ..backends.registry import needs_module

    for p in spec.precision:
        if p != GRAPH and p not in PRECISION_BYTES:
            raise UsageError(f"spec: 'precision' {p!r}: expected one of "
                             f"{', '.join([GRAPH, *PRECISION_BYTES])}")
    profiles = {"host", *available_profiles()}
    for hw in spec.hardware:
        if hw not in profiles and not Path(hw).is_file():
            raise UsageError(f"spec: 'hardware' {hw!r}: no such profile or file (one of "
                             f"{', '.join(sorted(profiles))}, or a .toml path)")
    for key, names in (("measure", spec.measure), ("resources", spec.resources)):
        for name in names:
            try:
                needs_module(name)  # raises on an unknown backend, probes nothing
            except UsageError as e:
                raise UsageError(f"spec: {key!r}: {e}") from None
    for model in spec.dims:
        if model not in spec.models:
            raise UsageError(f"spec: 'dims.{model}': not one of 'models'")
    if not spec.hardware and not spec.measure:
        raise UsageError("spec: nothing to do: give 'hardware' (estimates) or 'measure'")
