"""Hardware profiles: one TOML file per device, every number with its units in its name and a
source beside it.

File layout (see `analyzer/profiles/h100.toml` for a complete one)::

    name = "NVIDIA H100 SXM5 80 GB"
    kind = "gpu"                       # cpu | gpu | tpu | npu
    source = "where the device facts come from"

    [compute]                          # dense peaks, no structured sparsity
    peak_fp32_tflops = 66.9
    peak_tf32_tflops = 494.7           # a precision the device lacks is left out
    peak_fp16_tflops = 989.4
    peak_bf16_tflops = 989.4
    peak_int8_tops = 1978.9
    source = "..."

    [[memory]]                         # fastest first; the last level is main memory
    name = "L2"
    size_bytes = 52428800              # left out for main memory (unbounded)
    bandwidth_gbps = 5500.0            # GB/s, 1e9 bytes per second
    energy_pj_per_byte = 2.0
    source = "..."

    [overhead]
    kernel_launch_us = 4.0             # fixed cost per fused group (launch or dispatch)
    source = "..."

    [power]
    static_w = 100.0                   # drawn whenever the device is busy, whatever it does
    tdp_w = 700.0
    compute_pj_per_flop_fp32 = 0.6     # per precision; missing ones scale from fp32
    source = "..."

    [efficiency]                       # achievable fraction of peak per op class, uncalibrated
    conv = 0.6
    gemm = 0.7
    ...
    source = "..."

Peaks are per precision; int8 is in TOP/s under `peak_int8_tops`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import OnnxLensError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "int8")
# Storage bytes per element of each precision (tf32 is stored as fp32).
PRECISION_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "int8": 1}
# The op classes an estimate distinguishes; `analyzer.estimate.op_class` maps groups to them.
OP_CLASSES = ("conv", "depthwise", "gemm", "attention", "elementwise", "normalization",
              "pool", "reduce", "data_movement")
PROFILES_DIR = Path(__file__).parent / "profiles"


class HardwareProfileError(OnnxLensError):
    """A hardware profile file is missing, unreadable or has a bad field (named)."""


@dataclass(frozen=True, slots=True)
class MemoryLevel:
    name: str
    bandwidth_gbps: float
    size_bytes: int | None = None  # None: main memory, holds everything
    energy_pj_per_byte: float = 0.0
    source: str = ""


@dataclass(frozen=True)
class HardwareProfile:
    key: str  # how users name it: the file stem, "h100"
    name: str
    kind: str
    source: str
    peak_tflops: dict[str, float]  # precision -> dense peak in TFLOP/s (int8: TOP/s)
    memory: tuple[MemoryLevel, ...]  # fastest first; last is main memory
    kernel_launch_us: float
    static_w: float
    tdp_w: float
    compute_pj_per_flop: dict[str, float]  # precision -> pJ per FLOP
    efficiency: dict[str, float]  # op class -> achievable fraction of peak
    calibrated: bool = False
    sources: dict[str, str] = field(default_factory=dict)  # section -> source
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. cores, simd_bits of a CPU

    def peak_flops(self, precision: str) -> float:
        """Peak in FLOP/s (or OP/s for int8); a precision the device lacks falls back to the
        nearest wider one it has (fp16 -> fp32 on a CPU without fp16 units)."""
        for p in _FALLBACK[precision]:
            if p in self.peak_tflops:
                return self.peak_tflops[p] * 1e12
        raise HardwareProfileError(f"profile {self.key!r} has no peak for {precision}")

    def pj_per_flop(self, precision: str) -> float:
        if precision in self.compute_pj_per_flop:
            return self.compute_pj_per_flop[precision]
        # Energy per operation scales roughly with operand width (Horowitz, ISSCC 2014).
        return self.compute_pj_per_flop["fp32"] * PRECISION_BYTES[precision] / 4

    @property
    def main_memory(self) -> MemoryLevel:
        return self.memory[-1]


_FALLBACK = {"fp32": ("fp32",), "tf32": ("tf32", "fp32"), "fp16": ("fp16", "fp32"),
             "bf16": ("bf16", "fp16", "fp32"), "int8": ("int8", "fp16", "fp32")}


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A shipped profile by key (`h100`), `host` (detected and calibrated), or a TOML file."""
    text = str(name_or_path)
    if text == "host":
        from .host import host_profile

        return host_profile()
    path = Path(text)
    if not path.suffix and (PROFILES_DIR / f"{text}.toml").exists():
        path = PROFILES_DIR / f"{text}.toml"
    elif not path.exists():
        raise HardwareProfileError(f"hardware {text!r}: no such profile or file (profiles: "
                                   f"host, {', '.join(available_profiles())})")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise HardwareProfileError(f"{path}: cannot read ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise HardwareProfileError(f"{path}: not valid TOML ({e})") from None
    return profile_from_dict(data, key=path.stem, where=str(path))


def profile_from_dict(data: dict[str, Any], *, key: str, where: str) -> HardwareProfile:
    """Validate and build a profile; errors name the file and the field."""
    r = _Reader(data, where)
    compute = r.table("compute")
    peaks = {}
    for p in PRECISIONS:
        field_name = "peak_int8_tops" if p == "int8" else f"peak_{p}_tflops"
        if field_name in compute:
            peaks[p] = r.positive(compute, field_name, "compute")
    if "fp32" not in peaks:
        raise HardwareProfileError(f"{where}: compute.peak_fp32_tflops is required")
    levels = []
    memory = data.get("memory")
    if not isinstance(memory, list) or not memory:
        raise HardwareProfileError(f"{where}: [[memory]] needs at least one level")
    for i, level in enumerate(memory):
        section = f"memory[{i}]"
        if not isinstance(level, dict):
            raise HardwareProfileError(f"{where}: {section} must be a table")
        last = i == len(memory) - 1
        size = None if last and "size_bytes" not in level else int(
            r.positive(level, "size_bytes", section))
        levels.append(MemoryLevel(r.string(level, "name", section),
                                  r.positive(level, "bandwidth_gbps", section), size,
                                  r.non_negative(level, "energy_pj_per_byte", section, 0.0),
                                  str(level.get("source", ""))))
    sizes = [lv.size_bytes for lv in levels[:-1]]
    if any(a >= b for a, b in zip(sizes, sizes[1:])):  # type: ignore[operator]
        raise HardwareProfileError(f"{where}: memory levels must grow in size_bytes")
    overhead = r.table("overhead")
    power = r.table("power")
    energy = {p: r.non_negative(power, f"compute_pj_per_flop_{p}", "power")
              for p in PRECISIONS if f"compute_pj_per_flop_{p}" in power}
    if "fp32" not in energy:
        raise HardwareProfileError(f"{where}: power.compute_pj_per_flop_fp32 is required")
    eff_table = r.table("efficiency")
    efficiency = {}
    for cls in OP_CLASSES:
        value = r.positive(eff_table, cls, "efficiency")
        if value > 1:
            raise HardwareProfileError(f"{where}: efficiency.{cls} = {value} is over 1")
        efficiency[cls] = value
    sources = {name: str(data[name].get("source", "")) for name in
               ("compute", "overhead", "power", "efficiency") if isinstance(data.get(name), dict)}
    return HardwareProfile(
        key=key, name=r.string(data, "name", ""), kind=r.choice(data, "kind", ("cpu", "gpu",
                                                                               "tpu", "npu")),
        source=r.string(data, "source", ""), peak_tflops=peaks, memory=tuple(levels),
        kernel_launch_us=r.non_negative(overhead, "kernel_launch_us", "overhead"),
        static_w=r.non_negative(power, "static_w", "power"),
        tdp_w=r.positive(power, "tdp_w", "power"), compute_pj_per_flop=energy,
        efficiency=efficiency, calibrated=bool(data.get("calibrated", False)),
        sources=sources, extra=dict(data.get("extra", {})))


@dataclass(frozen=True)
class _Reader:
    data: dict[str, Any]
    where: str

    def _name(self, section: str, key: str) -> str:
        return f"{section}.{key}" if section else key

    def table(self, name: str) -> dict[str, Any]:
        value = self.data.get(name)
        if not isinstance(value, dict):
            raise HardwareProfileError(f"{self.where}: missing table [{name}]")
        return value

    def string(self, table: dict[str, Any], key: str, section: str) -> str:
        value = table.get(key)
        if not isinstance(value, str) or not value:
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} must be a "
                                       "non-empty string")
        return value

    def choice(self, table: dict[str, Any], key: str, options: tuple[str, ...]) -> str:
        value = self.string(table, key, "")
        if value not in options:
            raise HardwareProfileError(f"{self.where}: {key} = {value!r}, expected one of "
                                       f"{', '.join(options)}")
        return value

    def _number(self, table: dict[str, Any], key: str, section: str,
                default: float | None) -> float:
        if key not in table:
            if default is not None:
                return default
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} is required")
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} = {value!r} "
                                       "is not a finite number")
        return float(value)

    def positive(self, table: dict[str, Any], key: str, section: str) -> float:
        value = self._number(table, key, section, None)
        if value <= 0:
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} = {value} "
                                       "must be positive")
        return value

    def non_negative(self, table: dict[str, Any], key: str, section: str,
                     default: float | None = None) -> float:
        value = self._number(table, key, section, default)
        if value < 0:
            raise HardwareProfileError(f"{self.where}: {self._name(section, key)} = {value} "
                                       "must not be negative")
        return value
