"""The command line: `analyze MODEL` and `onnxlens <command>`, thin layers over the Python API.

MODEL is an ONNX file, a torchvision model name (`resnet18`) or `module:factory`; names are
exported once with random weights and cached. Errors caused by the input print one line and
exit non-zero; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console

from .analyzer.errors import OnnxLensError, UsageError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .analyzer.analysis import AnalysisResult
    from .backends.compare import Comparison, ModelSpec

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="onnxlens: where does the time go in a neural network.")
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

ModelArg = Annotated[str, typer.Argument(
    help="An .onnx file, a torchvision model name (resnet18) or module:factory.")]
ShapeOpt = Annotated[list[str] | None, typer.Option(
    "--input-shape", help="Pin an input's shape: NAME=1x3x224x224 (repeatable).")]
DimOpt = Annotated[list[str] | None, typer.Option(
    "--dim", help="Pin a named (symbolic) dim wherever the inputs use it: NAME=VALUE, 0 allowed "
    "(sequence_length=128, past_sequence_length=0; repeatable).")]
ImageSizeOpt = Annotated[int | None, typer.Option(
    help="Image side for exported models (default: the model's own crop size).")]
KeepBnOpt = Annotated[bool, typer.Option(
    "--keep-batchnorm", help="Export keeping BatchNormalization nodes (default: folded).")]
OpsetOpt = Annotated[int | None, typer.Option(help="ONNX opset for exported models.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")]
MaxTensorBytesOpt = Annotated[int, typer.Option(
    help="Refuse a model tensor or an input file's array larger than this.")]


def _run(debug: bool, fn, *args, **kwargs):
    # A command is one short process building a large object graph: the cyclic collector
    # would walk it again and again for nothing (a quarter of analyze's time on 50k nodes).
    gc.disable()
    try:
        return fn(*args, **kwargs)
    except OnnxLensError as e:
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {_one_line(e)}", markup=True, highlight=False)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(130) from None


def _one_line(e: Exception) -> str:
    from rich.markup import escape

    from .reports.terminal import plain

    return escape(plain(str(e).replace("\n", " "), 500))


def _int_list(text: str | None, flag: str) -> list[int]:
    if not text:
        return []
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected integers separated by commas") from None
    if any(v <= 0 for v in values):
        raise UsageError(f"{flag} {text!r}: values must be positive")
    return values


def _analyze(model: str, *, json_path: Path | None, csv_path: Path | None,
             html_path: Path | None, netron_path: Path | None, batch: str | None,
             input_shape: list[str] | None, image_size: int | None, keep_batchnorm: bool,
             opset: int | None, top: int, precision: str | None, measure: str | None, runs: int,
             dim: list[str] | None = None, trace_path: Path | None = None,
             context_len: str | None = None, **options: object) -> AnalysisResult:
    from .analyzer.loader import parse_dim_spec, parse_shape_spec
    from .analyzer.serialize import dump_json
    from .api import analyze, resolve_model
    from .reports.terminal import render

    if trace_path and not measure:
        raise UsageError("--trace writes measured times: it needs --measure BACKENDS")
    batches = _int_list(batch, "--batch")
    shapes = dict(parse_shape_spec(s) for s in input_shape or [])
    source = resolve_model(model, batch=batches[0] if batches else 1, image_size=image_size,
                           keep_batchnorm=keep_batchnorm, opset=opset)
    precisions = [p.strip() for p in (precision or "").split(",") if p.strip()]
    dims = dict(parse_dim_spec(s) for s in dim or []) or None
    result = analyze(source, batch=batches, precision=precisions, input_shapes=shapes,
                     dims=dims, context_len=_int_list(context_len, "--context-len") or None,
                     **options)
    # The per-node rows and every group's are only needed by the files; the summary shows
    # totals and the top groups.
    files = bool(json_path or html_path or netron_path)
    d = result.to_dict(nodes=files, top_groups=None if files else top)
    console = Console(highlight=False)
    render(d, console, top=top)
    if measure:
        from .backends.compare import attach_measurements, compare
        from .reports.compare_terminal import measuring, render_comparison

        spec = _model_spec(model, source, image_size=image_size, keep_batchnorm=keep_batchnorm,
                           opset=opset)
        with measuring(err_console) as progress:
            comparison = compare(spec, _names(measure), analysis=result, runs=runs, dims=dims,
                                 batches=batches[:1], threads=options["threads"] or 1,
                                 hardware={"ort-cuda": options["hardware"][0]}
                                 if options["hardware"] else None, progress=progress)
        render_comparison(comparison.to_dict(), console, top=top)
        d = attach_measurements(d, comparison.to_dict())
        if trace_path:
            _write_trace(comparison, trace_path, console)
    if json_path:
        dump_json(d, json_path)
    if csv_path:
        result.to_csv(csv_path)
        result.to_csv(csv_path.with_name(csv_path.stem + "_groups" + csv_path.suffix),
                      level="groups")
    if html_path:
        from .reports.html import write_html

        write_html(d, html_path)
    if netron_path:
        from .reports.netron import write_netron_attachment

        write_netron_attachment(d, netron_path)
    return result


def _write_trace(comparison: Comparison, path: Path, console: Console) -> None:
    from rich.markup import escape

    from .backends.trace import write_trace

    events = write_trace(comparison, path)
    console.print(escape(f"wrote {path} (Chrome trace, {events} events)"))


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("name at least one backend (onnxlens backends lists them)")
    return names


def _model_spec(model: str, source: Path, *, image_size: int | None, keep_batchnorm: bool,
                opset: int | None) -> ModelSpec:
    """What to measure: the file, and for a model onnxlens exports, how to rebuild the torch
    module (the torch backend) and how to export it at another batch."""
    from functools import partial

    from .backends.compare import ModelSpec

    if source.exists() and str(source) == model:
        return ModelSpec(source)
    from .exporters.torch_export import build_module, cached_export

    def at_batch(b: int) -> Path:
        return cached_export(model, batch=b, image_size=image_size,
                             keep_batchnorm=keep_batchnorm, opset=opset)

    return ModelSpec(source, torch_factory=partial(build_module, model, image_size),
                     at_batch=at_batch)


def analyze_command(
    model: ModelArg,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the analysis as JSON.")
                         ] = None,
    csv_path: Annotated[Path | None, typer.Option(
        "--csv", help="Write per-node CSV (and NAME_groups.csv per group).")] = None,
    html_path: Annotated[Path | None, typer.Option(
        "--html", help="Write the self-contained HTML report.")] = None,
    netron_path: Annotated[Path | None, typer.Option(
        "--netron", help="Write per-node metrics as a Netron attachment (drop it on the "
        "model open in Netron).")] = None,
    batch: Annotated[str | None, typer.Option(
        "--batch", "-b", help="Pin the batch (first) dim of every input; a list (1,8,32) "
        "sweeps the estimates over it.")] = None,
    input_shape: ShapeOpt = None,
    dim: DimOpt = None,
    hardware: Annotated[list[str] | None, typer.Option(
        "--hardware", "-H", help="Estimate on a profile: host, h100, ... or a .toml file "
        "(repeatable; `onnxlens hardware` lists them).")] = None,
    precision: Annotated[str | None, typer.Option(
        help="Precision(s) of the estimates: the graph's own when left out (fp32 for an fp32 "
        "model, each group's for a quantized or fp16 one); fp32, tf32, fp16, bf16, int8 are "
        "what-ifs of an fp32 model (a list sweeps).")] = None,
    threads: Annotated[int | None, typer.Option(
        min=1, help="Threads the host profile assumes (its calibration).")] = None,
    runtime: Annotated[str, typer.Option(
        help="The runtime whose kernels the estimates cost: ort-cpu or native-cpu on `-H host` "
        "(with that runtime's calibration, `onnxlens calibrate --backend`), native-cuda on a "
        "GPU profile (uncalibrated).")] = "ort-cpu",
    cached_until: Annotated[str | None, typer.Option(
        help="What if every node up to this one were cached (node, tensor or module path)?")
                            ] = None,
    from_node: Annotated[str | None, typer.Option("--from", help="Cost of the subgraph from "
                                                  "this node ...")] = None,
    to_node: Annotated[str | None, typer.Option("--to", help="... to this one.")] = None,
    plus: Annotated[Path | None, typer.Option(
        help="Add another model's cost (e.g. a student model) to the what-if.")] = None,
    measure: Annotated[str | None, typer.Option(
        help="Also measure on backends (ort-cpu,...): per-group measured vs estimated.")
                       ] = None,
    runs: Annotated[int, typer.Option(min=1, help="Timed runs per backend (--measure).")] = 50,
    trace_path: Annotated[Path | None, typer.Option(
        "--trace", help="Write the measured per-group timeline (--measure) as a Chrome trace "
        "(Perfetto, chrome://tracing).")] = None,
    prompt_len: Annotated[int | None, typer.Option(
        min=1, help="LLM view (a model with KV-cache inputs): prefill at this many prompt "
        "tokens [default: 512].")] = None,
    context_len: Annotated[str | None, typer.Option(
        help="LLM view: decode one token at this context; a list (128,1024,8192) sweeps "
        "[default: 2048].")] = None,
    strict: Annotated[bool, typer.Option(help="Fail on ops with no cost formula.")] = False,
    top: Annotated[int, typer.Option(min=1, help="Groups to list.")] = 10,
    flops_per_mac: Annotated[int, typer.Option(
        min=1, max=2, help="FLOPs per multiply-accumulate: 2 (default) or 1.")] = 2,
    image_size: ImageSizeOpt = None,
    keep_batchnorm: KeepBnOpt = False,
    opset: OpsetOpt = None,
    max_tensor_bytes: MaxTensorBytesOpt = 1 << 38,
    max_nesting_depth: Annotated[int | None, typer.Option(
        help="Refuse If/Loop/Scan bodies and local-function calls nested deeper [default: 32]."
    )] = None,
    max_window_value: Annotated[int | None, typer.Option(
        help="Refuse a kernel, stride, dilation, pad, group or block size over this "
        "[default: 2**31-1].")] = None,
    max_expanded_nodes: Annotated[int | None, typer.Option(
        help="Refuse a model whose nodes, local-function calls inlined, are more than this "
        "[default: 1000000].")] = None,
    debug: DebugOpt = False,
) -> object:  # the AnalysisResult (typer evaluates this annotation: no name only for mypy)
    """Costs, fused groups and memory of a model; estimates on hardware; what-if."""
    return _run(debug, _analyze, model, json_path=json_path, csv_path=csv_path, html_path=html_path,
         netron_path=netron_path, batch=batch,
         input_shape=input_shape, dim=dim, image_size=image_size, keep_batchnorm=keep_batchnorm,
         opset=opset, top=top, precision=precision, measure=measure, runs=runs,
         trace_path=trace_path, hardware=hardware or [], threads=threads, runtime=runtime,
         cached_until=cached_until, from_node=from_node, to_node=to_node, plus=plus,
         prompt_len=prompt_len, context_len=context_len,
         strict=strict, flops_per_mac=flops_per_mac, max_tensor_bytes=max_tensor_bytes,
         max_nesting_depth=max_nesting_depth, max_window_value=max_window_value,
         max_expanded_nodes=max_expanded_nodes)


app.command("analyze")(analyze_command)


@app.command("export")
def export_command(
    model: Annotated[str, typer.Argument(help="A torchvision model name or module:factory.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The .onnx file to write.")],
    batch: Annotated[int, typer.Option("--batch", "-b", min=1)] = 1,
    image_size: ImageSizeOpt = None,
    keep_batchnorm: KeepBnOpt = False,
    opset: OpsetOpt = None,
    dynamic_batch: Annotated[bool, typer.Option(help="Make the batch dim symbolic.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Export a framework model to ONNX (random weights)."""
    from .exporters.torch_export import export_model

    path = _run(debug, export_model, model, output, batch=batch, image_size=image_size,
                keep_batchnorm=keep_batchnorm, opset=opset, dynamic_batch=dynamic_batch)
    Console(highlight=False).print(f"wrote {path}")


@app.command("compare")
def compare_command(
    model: ModelArg,
    backends: Annotated[str, typer.Option(help="Backends to run, comma separated.")
                        ] = "ort-cpu",
    threads: Annotated[int, typer.Option(min=1, help="Threads per backend (pinned).")] = 1,
    runs: Annotated[int, typer.Option(min=1, help="Timed runs.")] = 50,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed runs first.")] = 5,
    batch: Annotated[str | None, typer.Option(
        "--batch", "-b", help="Batch sizes for latency and throughput, e.g. 1,8,32.")] = None,
    inputs: Annotated[list[Path] | None, typer.Option(
        "--inputs", help="Input files (.npy/.npz/.pb) for the agreement check (repeatable).")
                      ] = None,
    samples: Annotated[int, typer.Option(min=1, help="Random input sets otherwise.")] = 20,
    dump_diff: Annotated[bool, typer.Option(
        help="Compare every intermediate tensor; name the first node that diverges.")] = False,
    gpu_profile: Annotated[str | None, typer.Option(
        help="Hardware profile to set beside ort-cuda's measurement (e.g. h100).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the comparison.")
                         ] = None,
    trace_path: Annotated[Path | None, typer.Option(
        "--trace", help="Write the measured per-group timeline as a Chrome trace (Perfetto, "
        "chrome://tracing).")] = None,
    dim: DimOpt = None,
    image_size: ImageSizeOpt = None,
    keep_batchnorm: KeepBnOpt = False,
    opset: OpsetOpt = None,
    max_tensor_bytes: MaxTensorBytesOpt = 1 << 38,
    debug: DebugOpt = False,
) -> None:
    """Measure a model on several backends: latency, throughput, per-group time, agreement."""
    _run(debug, _compare, model, backends=backends, threads=threads, runs=runs, warmup=warmup,
         batch=batch, inputs=inputs or [], samples=samples, dump_diff=dump_diff,
         gpu_profile=gpu_profile, json_path=json_path, trace_path=trace_path, dim=dim,
         image_size=image_size,
         keep_batchnorm=keep_batchnorm, opset=opset, max_tensor_bytes=max_tensor_bytes)


def _compare(model: str, *, backends: str, threads: int, runs: int, warmup: int,
             batch: str | None, inputs: list[Path], samples: int, dump_diff: bool,
             gpu_profile: str | None, json_path: Path | None, trace_path: Path | None,
             dim: list[str] | None,
             image_size: int | None, keep_batchnorm: bool, opset: int | None,
             max_tensor_bytes: int) -> None:
    from dataclasses import replace

    from .analyzer.loader import parse_dim_spec
    from .analyzer.serialize import dump_json
    from .analyzer.validate import DEFAULT_LIMITS
    from .api import resolve_model
    from .backends.compare import compare
    from .reports.compare_terminal import measuring, render_comparison

    batches = _int_list(batch, "--batch")
    source = resolve_model(model, batch=batches[0] if batches else 1, image_size=image_size,
                           keep_batchnorm=keep_batchnorm, opset=opset)
    spec = _model_spec(model, source, image_size=image_size, keep_batchnorm=keep_batchnorm,
                       opset=opset)
    with measuring(err_console) as progress:
        result = compare(spec, _names(backends), threads=threads, runs=runs, warmup=warmup,
                         batches=batches, inputs=inputs, samples=samples, dump_diff=dump_diff,
                         hardware={"ort-cuda": gpu_profile} if gpu_profile else None,
                         limits=replace(DEFAULT_LIMITS, max_tensor_bytes=max_tensor_bytes),
                         progress=progress, dims=dict(parse_dim_spec(s) for s in dim or []))
    d = result.to_dict()
    console = Console(highlight=False)
    render_comparison(d, console)
    if json_path:
        dump_json(d, json_path)
    if trace_path:
        _write_trace(result, trace_path, console)
    if result.nothing_ran:
        raise typer.Exit(3)


@app.command("backends")
def backends_command(
    ops: Annotated[bool, typer.Option("--ops", help="List the ops each backend covers.")
                   ] = False,
) -> None:
    """List the measured backends, whether each runs here, and why not."""
    from .backends.registry import list_backends
    from .reports.compare_terminal import render_backends

    render_backends([b.to_dict() for b in list_backends(ops=ops)], Console(highlight=False))


@app.command("report")
def report_command(
    analysis: Annotated[Path, typer.Argument(
        help="A JSON file written by `analyze --json`, or a sweep's --out directory.")],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="The .html file to write (a sweep: DIR/report.html).")] = None,
    debug: DebugOpt = False,
) -> None:
    """Render the HTML report of a saved analysis, or again that of a sweep."""

    def render() -> Path:
        if analysis.is_dir():
            from .sweep.driver import rewrite_outputs

            return rewrite_outputs(analysis, output)
        from .reports.html import load_analysis_json, write_html

        if output is None:
            raise UsageError("--output: name the .html file to write")
        saved = load_analysis_json(analysis)
        try:
            return write_html(saved, output)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            # A saved JSON is not trusted: a field missing or of another type is the file's
            raise UsageError(f"{analysis}: a malformed analysis ({type(e).__name__}: {e}); "
                             "write it again with analyze --json") from e

    Console(highlight=False).print(f"wrote {_run(debug, render)}")


@app.command("sweep")
def sweep_command(
    spec_path: Annotated[Path, typer.Argument(
        metavar="SPEC.toml", help="The sweep: models, batch, precision, hardware, measure ...")],
    out: Annotated[Path, typer.Option("--out", help="Directory of results.jsonl, results.csv "
                                      "and report.html; a re-run resumes it.")],
    engine: Annotated[str, typer.Option(help="local (a process pool) or ray.")] = "local",
    address: Annotated[str | None, typer.Option(
        help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray instance).")] = None,
    debug: DebugOpt = False,
) -> None:
    """Sweep models x batches x precisions x hardware and backends; exit 1 if a row failed."""
    from .sweep import load_spec, run_sweep
    from .sweep.progress import sweep_progress

    def sweep() -> object:
        spec = load_spec(spec_path)
        with sweep_progress(err_console) as progress:
            return run_sweep(spec, out, engine=engine, address=address, progress=progress)

    outcome = _run(debug, sweep)
    Console(highlight=False).print(
        f"{outcome.rows} rows, {outcome.failed} failed, {outcome.skipped} done before; wrote "
        f"{out / 'results.jsonl'}, results.csv, report.html")
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)


@app.command("calibrate")
def calibrate_command(
    threads: Annotated[int, typer.Option(min=1, help="Threads to calibrate for (pinned).")
                       ] = 1,
    budget: Annotated[float, typer.Option(min=5, help="Seconds to spend, about.")] = 100,
    backend: Annotated[str, typer.Option(
        help="Runtime to measure: ort-cpu (what `--hardware host` uses), native-cpu, or on a "
        "machine with a GPU ort-cuda or native-cuda (with --profile).")] = "ort-cpu",
    profile: Annotated[str | None, typer.Option(
        help="The GPU a GPU backend measures: its profile (a100, h100, ... or a .toml), "
        "which `-H NAME --runtime BACKEND` then estimates calibrated.")] = None,
    debug: DebugOpt = False,
) -> None:
    """Measure this host through ONNX Runtime (or the native executor) and save the
    efficiency curves `--hardware host` then uses."""
    from .backends.calibrate.fit import describe_fit_check
    from .backends.calibrate.measure import run_calibration

    def calibrate() -> Path:
        return run_calibration(threads, budget_s=budget, progress=True, backend=backend,
                               profile=profile).save()

    path = _run(debug, calibrate)
    from .analyzer.calibration import Calibration, apply_calibration
    from .analyzer.hardware import load_profile
    from .analyzer.host import host_profile

    cal = Calibration.load(path)
    base = load_profile(cal.profile) if cal.profile else host_profile(threads)
    hw = apply_calibration(base, cal)
    what = f"{cal.profile} through {backend}" if cal.profile else f"host at {threads} thread(s)"
    Console(highlight=False).print(
        "".join(f"note: {n}\n" for n in cal.notes) +
        f"wrote {path}\n{what}: fp32 peak "
        f"{hw.peak_tflops['fp32'] * 1e3:.1f} GFLOP/s, main memory "
        f"{hw.main_memory.bandwidth_gbps:.1f} GB/s, kernel overhead {hw.kernel_launch_us:.1f} µs, "
        f"a transcendental {cal.transcendental_flops:.1f} FLOPs, cold weights "
        f"{cal.cold_weight_gbps:.1f} GB/s, cold depthwise filter lines {cal.cold_line_ns:.1f} ns"
        f", cold kernels {cal.cold_kernel_us:.2f} µs\n{describe_fit_check(cal)}")


@app.command("hardware")
def hardware_command(
    threads: Annotated[int | None, typer.Option(min=1, help="Threads for the host profile.")
                       ] = None,
    debug: DebugOpt = False,
) -> None:
    """List the hardware profiles with their key numbers and sources."""
    from .analyzer.calibration import resolve_target
    from .analyzer.hardware import available_profiles
    from .reports.terminal import render_hardware

    def profiles() -> list:
        return [resolve_target(name, threads)[0] for name in ["host", *available_profiles()]]

    render_hardware(_run(debug, profiles), Console(highlight=False))


@app.command("ops")
def ops_command() -> None:
    """List the ops that have a cost formula, by family."""
    from .analyzer.cost import REGISTRY

    families: dict[str, list[str]] = {}
    for (domain, op), spec in sorted(REGISTRY.items()):
        families.setdefault(spec.family, []).append(f"{domain}::{op}" if domain else op)
    console = Console(highlight=False)
    for family, ops in sorted(families.items()):
        console.print(f"[bold]{family}[/] ({len(ops)}): " + ", ".join(ops))


def main() -> None:
    app()


def analyze_main() -> None:
    """The `analyze` console script: `onnxlens analyze` under a shorter name."""
    args = sys.argv[1:]
    if len(args) == 1 and not args[0].startswith("-"):
        _analyze_model_only(args[0])
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    single.command()(_ending_the_program(analyze_command))
    single()


def _ending_the_program(command: Callable[..., object]) -> Callable[..., object]:
    """`command`, ending the `analyze` program once it has run (`_end_holding`)."""

    @functools.wraps(command)  # typer reads the options from the signature it points to
    def run(*args: object, **kwargs: object) -> object:
        result = command(*args, **kwargs)
        _end_holding(result)
        return result

    return run


def _analyze_model_only(model: str) -> NoReturn:
    """`analyze MODEL` with no option, run as typer runs it but without its parsing: with
    nothing to parse, every option is at its default, the function's own (a test holds both
    ways to the same call). Typer builds a pydantic validator per option first: 0.3 s of a
    50,000-node analysis, with pydantic's import."""
    try:
        result = analyze_command(model)
        sys.stdout.flush()
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `analyze m.onnx | head`: as typer, exit 1 without a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    _end_holding(result)
    del result  # a caller goes on: free it now
    sys.exit(0)


def _end_holding(result: object) -> None:
    """When this process is the `analyze` program, end it here, with `result` still held: the
    OS takes its memory back at once, where Python would free the analysis object by object
    and then tear its modules down (a quarter of a second on 50,000 nodes, with or without
    options). Nothing is left to write. A caller that goes on gets `result` back."""
    if _is_analyze_program():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _is_analyze_program() -> bool:
    """Whether this process is a launcher of `analyze_main` run as a program (the `analyze`
    console script), not a caller that goes on after it (a test, a script run with -c)."""
    main_module = sys.modules.get("__main__")
    return (getattr(main_module, "analyze_main", None) is analyze_main
            and getattr(main_module, "__file__", None) == sys.argv[0])


if __name__ == "__main__":
    sys.exit(main())
