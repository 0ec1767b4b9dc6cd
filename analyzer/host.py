"""This machine as a hardware profile, detected from /proc/cpuinfo and /sys (no heavy imports).

What is detected, and what stays assumed until `onnxlens calibrate` measures it:

- cores: the physical cores among the CPUs this process may run on (`os.sched_getaffinity`;
  SMT siblings, from `/sys/devices/system/cpu/cpuN/topology/thread_siblings_list`, count once).
  `host_profile(threads)` uses `min(threads, cores)` of them, so a measurement at one thread is
  compared with a one-core peak.
- frequency: cpufreq `cpuinfo_max_freq` (then `scaling_max_freq`) when present, else the first
  `cpu MHz` of /proc/cpuinfo (virtual machines often give only this), else an assumed 2.0 GHz.
- SIMD width from the flags: avx512f 512 bits, avx2 or avx 256, sse2 128, asimd (NEON) 128.
  FMA units: assumed 2 per core (two FMA ports, as on AVX2/AVX-512 server cores and Arm
  Cortex-A7x/Neoverse-N cores; a core with one is overestimated 2x until calibrated); x86
  without `fma` counts its separate multiply and add ports as one. AMD Zen 4 runs AVX-512 on
  256-bit units, so its fp32 peak is overestimated 2x until calibrated.
- peak_fp32 = cores x GHz x SIMD lanes x 2 (an FMA is 2 FLOPs) x FMA units. Other precisions
  only where a flag shows the units: AMX (amx_bf16, amx_fp16: 1,024, amx_int8: 2,048 ops per
  clock per core), else avx512_bf16 and avx512_fp16 or asimdhp at 2x, avx512_vnni, avx_vnni or
  asimddp at 4x the fp32 rate.
- caches: `/sys/devices/system/cpu/cpuN/cache/index*/{level,type,size,shared_cpu_list}` of the
  first allowed CPU, instruction caches skipped. A level's capacity is one instance's size times
  the instances the used cores touch, and `size_bytes` counts the capacity up to and including
  the level (caches are mostly not inclusive; this also keeps the levels growing). Without that
  directory: assumed 32 KiB L1 and 1 MiB L2 per core, plus the `cache size` line of /proc/cpuinfo
  (the last-level cache on x86) when there is one.
- bandwidths, assumed sustained rates per core: L1 two vector loads per clock, each further level
  half the level before (at least 8 B per clock), main memory 10 GB/s per core.
- energy and power, assumed as in the Xeon 8480+ profile: 6.25 W per core at TDP (350 W over
  56 cores), 30% of it static; pJ/FLOP = 0.8 x (TDP - static) / peak; SRAM energy from
  Horowitz (ISSCC 2014) scaled to a 10 nm-class node, DDR at 120 pJ/B.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .hardware import (
    PEAK_FIELDS,
    HardwareProfile,
    MemoryLevel,
    profile_from_dict,
    profile_to_dict,
)

# Where the facts are read; tests point these at a fake tree.
PROC_CPUINFO = Path("/proc/cpuinfo")
SYS_CPU = Path("/sys/devices/system/cpu")

DEFAULT_GHZ = 2.0
FMA_UNITS = 2
DRAM_GBPS_PER_CORE = 10.0
WATTS_PER_CORE = 350.0 / 56  # Xeon Platinum 8480+: TDP over cores
STATIC_FRACTION = 0.3
COMPUTE_SHARE = 0.8  # of dynamic power at peak, the rest is memory traffic charged per byte
# Horowitz ISSCC 2014, 45 nm: 64-bit read of a 32 KB SRAM 20 pJ, of a 1 MB SRAM 100 pJ; scaled
# x0.32 to a 10 nm-class node (x0.75 per full node after 45 nm). Beyond L2: twice L2, for the
# wires to a shared slice.
PJ_PER_BYTE = {1: 2.5 * 0.32, 2: 12.5 * 0.32}
PJ_PER_BYTE_SHARED = 25.0 * 0.32
DRAM_PJ_PER_BYTE = 120.0  # assumed 15 pJ/bit for DDR DIMMs with their I/O
ASSUMED_CACHES = ((1, 32 * 1024), (2, 1024 * 1024))  # per core, when /sys has no cache info
# Uncalibrated efficiency per op class: the defaults of the shipped CPU profiles (reasons there).
EFFICIENCY = {"conv": 0.7, "depthwise": 0.1, "gemm": 0.8, "attention": 0.5, "elementwise": 0.5,
              "normalization": 0.25, "pool": 0.25, "reduce": 0.25, "data_movement": 0.5}
# precision -> (cpuinfo flag, FLOPs per clock per core given the fp32 rate); first match wins.
_UNITS: dict[str, tuple[tuple[str, Callable[[int], int]], ...]] = {
    "bf16": (("amx_bf16", lambda f: 1024), ("avx512_bf16", lambda f: 2 * f)),
    "fp16": (("amx_fp16", lambda f: 1024), ("avx512_fp16", lambda f: 2 * f),
             ("asimdhp", lambda f: 2 * f)),
    "int8": (("amx_int8", lambda f: 2048), ("avx512_vnni", lambda f: 4 * f),
             ("avx_vnni", lambda f: 4 * f), ("asimddp", lambda f: 4 * f)),
}
_SIMD = (("avx512f", 512), ("avx2", 256), ("avx", 256), ("sse2", 128), ("asimd", 128))
# The flags a profile's numbers depend on, kept in its `extra`.
_RELEVANT_FLAGS = {"fma", *(name for name, _ in _SIMD),
                   *(flag for options in _UNITS.values() for flag, _ in options)}


@dataclass(frozen=True)
class Cache:
    level: int
    size_bytes: int  # one instance
    cpus_sharing: int  # logical CPUs that share one instance


@dataclass(frozen=True)
class CpuFacts:
    model: str
    logical_cpus: int  # the CPUs this process may run on
    cores: int  # physical cores among them
    smt: int  # logical CPUs per core
    freq_ghz: float
    freq_source: str
    simd: str
    simd_bits: int
    fma_units: int
    flags: frozenset[str]
    caches: tuple[Cache, ...]  # data and unified caches, by level; empty when /sys has none
    llc_bytes: int | None  # /proc/cpuinfo `cache size`, the fallback when /sys has none

    def flops_per_clock(self) -> dict[str, int]:
        """FLOPs (int8: ops) per clock per core, per precision the flags show units for."""
        fp32 = self.simd_bits // 32 * 2 * self.fma_units
        out = {"fp32": fp32}
        for precision, options in _UNITS.items():
            rate = next((ops(fp32) for flag, ops in options if flag in self.flags), None)
            if rate is not None:
                out[precision] = rate
        return out


def detect_cpu() -> CpuFacts:
    """The CPU facts of this machine (see the module docstring for each source)."""
    info = _cpuinfo()
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1))
    first = allowed[0]
    siblings = {_read(SYS_CPU / f"cpu{c}/topology/thread_siblings_list") or str(c)
                for c in allowed}
    smt = _cpu_list_count(_read(SYS_CPU / f"cpu{first}/topology/thread_siblings_list") or "0")
    flags = frozenset((info.get("flags") or info.get("features") or "").split())
    simd, bits = next(((name, b) for name, b in _SIMD if name in flags), ("scalar", 32))
    fma = FMA_UNITS if simd == "asimd" or "fma" in flags else 1
    freq, freq_source = _frequency(first, info)
    return CpuFacts(
        model=_model(info), logical_cpus=len(allowed), cores=len(siblings), smt=smt,
        freq_ghz=freq, freq_source=freq_source, simd="neon" if simd == "asimd" else simd,
        simd_bits=bits, fma_units=fma, flags=flags, caches=_caches(first),
        llc_bytes=_size(info.get("cache size", "")))


def host_profile(threads: int | None = None) -> HardwareProfile:
    """This machine as an uncalibrated profile (key `host`). `threads` is the thread count of
    the run it describes (a calibration's): the peak and the caches scale with the cores those
    threads use, at most the physical cores available."""
    cpu = detect_cpu()
    used = cpu.cores if threads is None else max(1, min(threads, cpu.cores))
    run_threads = threads or cpu.cores
    per_clock = cpu.flops_per_clock()
    peaks = {p: used * cpu.freq_ghz * ops / 1000 for p, ops in per_clock.items()}
    tdp = WATTS_PER_CORE * used
    static = STATIC_FRACTION * tdp
    levels, caches = _memory(cpu, used)
    units = ", ".join(f"{p} {ops}" for p, ops in per_clock.items())
    data: dict[str, Any] = {
        "name": f"This host: {cpu.model}",
        "kind": "cpu",
        "source": (f"detected from {PROC_CPUINFO} and {SYS_CPU}: {cpu.model}, {used} of "
                   f"{cpu.cores} physical cores ({cpu.logical_cpus} CPUs allowed), "
                   f"{cpu.freq_ghz:.4g} GHz ({cpu.freq_source}), {cpu.simd} "
                   f"({cpu.simd_bits}-bit); the assumptions are listed in analyzer/host.py"),
        "compute": {
            **{PEAK_FIELDS[p]: v for p, v in peaks.items()}, "simd_bits": cpu.simd_bits,
            "source": (f"detected: {used} cores x {cpu.freq_ghz:.4g} GHz x FLOPs per clock per "
                       f"core ({units}); fp32 = {cpu.simd_bits // 32} lanes x 2 (FMA) x "
                       f"{cpu.fma_units} FMA units (assumed: {FMA_UNITS} FMA ports per core)")},
        "memory": levels,
        "overhead": {
            "kernel_launch_us": 2.0 if run_threads == 1 else 5.0,
            "source": ("assumed: about 2 us to dispatch an ONNX Runtime CPU kernel, plus 3 us of "
                       "thread-pool fork/join when more than one thread runs it")},
        "power": {
            "static_w": static, "tdp_w": tdp,
            **{f"compute_pj_per_flop_{p}": COMPUTE_SHARE * (tdp - static) / v
               for p, v in peaks.items()},
            "source": (f"assumed: {WATTS_PER_CORE} W per core at TDP (Xeon 8480+: 350 W over 56 "
                       f"cores), {STATIC_FRACTION:.0%} of it static; pJ/FLOP = "
                       f"{COMPUTE_SHARE} x (tdp_w - static_w) / peak")},
        "efficiency": {
            **EFFICIENCY,
            "source": ("uncalibrated defaults of the shipped CPU profiles (reasons in "
                       "xeon_8480.toml); `onnxlens calibrate` measures them")},
        "extra": {"cores": used, "cores_available": cpu.cores, "logical_cpus": cpu.logical_cpus,
                  "threads": run_threads, "model": cpu.model, "simd": cpu.simd,
                  "fma_units": cpu.fma_units,
                  "freq_ghz": cpu.freq_ghz, "freq_source": cpu.freq_source, "caches": caches,
                  "caches_detected": bool(cpu.caches),
                  "flags": sorted(cpu.flags & _RELEVANT_FLAGS)},
    }
    return profile_from_dict(data, key="host", where="host detection")


def replace_measured(profile: HardwareProfile, *, peak_tflops: dict[str, float] | None = None,
                     memory: Iterable[MemoryLevel] | None = None,
                     kernel_launch_us: float | None = None,
                     efficiency: dict[str, float] | None = None, calibrated: bool = True,
                     source: str = "measured by onnxlens calibrate") -> HardwareProfile:
    """`profile` with measured numbers in place of its assumed ones, validated like a file
    (errors name the field). Peaks and efficiencies merge into the profile's (give only what was
    measured); `memory` replaces all levels; `source` becomes the source of each replaced
    section (memory levels carry their own)."""
    sources = dict(profile.sources)
    changes: dict[str, Any] = {"calibrated": calibrated}
    if peak_tflops is not None:
        changes["peak_tflops"] = {**profile.peak_tflops, **peak_tflops}
        sources["compute"] = source
    if memory is not None:
        changes["memory"] = tuple(memory)
    if kernel_launch_us is not None:
        changes["kernel_launch_us"] = kernel_launch_us
        sources["overhead"] = source
    if efficiency is not None:
        changes["efficiency"] = {**profile.efficiency, **efficiency}
        sources["efficiency"] = source
    measured = replace(profile, sources=sources, **changes)
    return profile_from_dict(profile_to_dict(measured), key=profile.key,
                             where=f"{profile.key} (measured)")


def _memory(cpu: CpuFacts, used: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Memory levels (file layout) for `used` cores, and the cache facts behind them."""
    if cpu.caches:
        caches = [(c.level, c.size_bytes, math.ceil(used / max(1, c.cpus_sharing // cpu.smt)),
                   c.cpus_sharing, f"{SYS_CPU}/cpuN/cache") for c in cpu.caches]
    else:
        caches = [(level, size, used, 1, "assumed per core: /sys has no cache info")
                  for level, size in ASSUMED_CACHES]
        if cpu.llc_bytes:
            caches.append((len(caches) + 1, cpu.llc_bytes, 1, cpu.logical_cpus,
                           f"`cache size` of {PROC_CPUINFO}"))
    levels = []
    total = 0
    bytes_per_clock = 2 * cpu.simd_bits / 8
    for level, size, instances, _, where in caches:
        total += size * instances
        levels.append({
            "name": f"L{level}", "size_bytes": total,
            "bandwidth_gbps": bytes_per_clock * used * cpu.freq_ghz,
            "energy_pj_per_byte": PJ_PER_BYTE.get(level, PJ_PER_BYTE_SHARED),
            "source": (f"{size} B x {instances} instance(s) ({where}), counted with the levels "
                       f"before it; assumed {bytes_per_clock:g} B per clock per core")})
        bytes_per_clock = max(8.0, bytes_per_clock / 2)
    levels.append({
        "name": "DRAM", "bandwidth_gbps": DRAM_GBPS_PER_CORE * used,
        "energy_pj_per_byte": DRAM_PJ_PER_BYTE,
        "source": (f"assumed until calibrated: {DRAM_GBPS_PER_CORE:g} GB/s per core, "
                   f"{DRAM_PJ_PER_BYTE:g} pJ/B")})
    facts = [{"level": level, "size_bytes": size, "instances": instances,
              "cpus_sharing": sharing} for level, size, instances, sharing, _ in caches]
    return levels, facts


def _cpuinfo() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo, keys lower-cased ({} when unreadable)."""
    text = _read(PROC_CPUINFO) or ""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip().lower(), value.strip())
    return out


def _model(info: dict[str, str]) -> str:
    for key in ("model name", "processor name", "hardware"):
        if info.get(key):
            return info[key]
    if "cpu implementer" in info:
        return (f"Arm CPU (implementer {info['cpu implementer']}, part "
                f"{info.get('cpu part', '?')})")
    return "unknown CPU"


def _frequency(cpu: int, info: dict[str, str]) -> tuple[float, str]:
    for name in ("cpuinfo_max_freq", "scaling_max_freq"):
        path = SYS_CPU / f"cpu{cpu}/cpufreq/{name}"
        khz = _number(_read(path))
        if khz:
            return khz / 1e6, str(path)
    mhz = _number(info.get("cpu mhz"))
    if mhz:
        return mhz / 1e3, f"`cpu MHz` of {PROC_CPUINFO}"
    return DEFAULT_GHZ, "assumed: no frequency in /sys or /proc"


def _caches(cpu: int) -> tuple[Cache, ...]:
    found: dict[int, Cache] = {}
    for index in sorted((SYS_CPU / f"cpu{cpu}/cache").glob("index*")):
        level = _number(_read(index / "level"))
        size = _size(_read(index / "size") or "")
        if _read(index / "type") == "Instruction" or not level or not size:
            continue
        sharing = _cpu_list_count(_read(index / "shared_cpu_list") or str(cpu))
        found.setdefault(int(level), Cache(int(level), size, sharing))
    return tuple(found[level] for level in sorted(found))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value and math.isfinite(value) and value > 0 else None


def _size(text: str) -> int | None:
    """`48K`, `2048K`, `105M`, `107520 KB` -> bytes."""
    text = text.strip().upper().removesuffix("B").strip()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    value = _number(text.rstrip("KMG").strip())
    return int(value * scale) if value else None


def _cpu_list_count(text: str) -> int:
    """`0-3,8,10-11` -> 7."""
    count = 0
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit():
            count += int(hi) - int(lo) + 1 if hi.isdigit() else 1
    return max(1, count)
