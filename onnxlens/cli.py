"""The command line: `analyze MODEL` and `onnxlens <command>`, thin layers over the Python API.

MODEL is an ONNX file, a torchvision model name (`resnet18`) or `module:factory`; names are
exported once with random weights and cached. Errors caused by the input print one line and
exit non-zero; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from .analyzer.errors import OnnxLensError, UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="onnxlens: where does the time go in a neural network.")
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

ModelArg = Annotated[str, typer.Argument(
    help="An .onnx file, a torchvision model name (resnet18) or module:factory.")]
ShapeOpt = Annotated[list[str] | None, typer.Option(
    "--input-shape", help="Pin an input's shape: NAME=1x3x224x224 (repeatable).")]
ImageSizeOpt = Annotated[int | None, typer.Option(
    help="Image side for exported models (default: the model's own crop size).")]
KeepBnOpt = Annotated[bool, typer.Option(
    "--keep-batchnorm", help="Export keeping BatchNormalization nodes (default: folded).")]
OpsetOpt = Annotated[int | None, typer.Option(help="ONNX opset for exported models.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")]


def _run(debug: bool, fn, *args, **kwargs):
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
             opset: int | None, top: int, precision: str, **options: object) -> None:
    from .analyzer.loader import parse_shape_spec
    from .api import analyze, resolve_model
    from .reports.terminal import render

    batches = _int_list(batch, "--batch")
    shapes = dict(parse_shape_spec(s) for s in input_shape or [])
    source = resolve_model(model, batch=batches[0] if batches else 1, image_size=image_size,
                           keep_batchnorm=keep_batchnorm, opset=opset)
    precisions = [p.strip() for p in precision.split(",") if p.strip()]
    result = analyze(source, batch=batches, precision=precisions, input_shapes=shapes,
                     **options)
    render(result, Console(highlight=False), top=top)
    if json_path:
        result.to_json(json_path)
    if csv_path:
        result.to_csv(csv_path)
        result.to_csv(csv_path.with_name(csv_path.stem + "_groups" + csv_path.suffix),
                      level="groups")
    if html_path:
        from .reports.html import write_html

        write_html(result.to_dict(), html_path)
    if netron_path:
        from .reports.netron import write_netron_attachment

        write_netron_attachment(result.to_dict(), netron_path)


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
    hardware: Annotated[list[str] | None, typer.Option(
        "--hardware", "-H", help="Estimate on a profile: host, h100, ... or a .toml file "
        "(repeatable; `onnxlens hardware` lists them).")] = None,
    precision: Annotated[str, typer.Option(
        help="Precision(s) of the estimates: fp32, tf32, fp16, bf16, int8 (a list sweeps).")
                         ] = "fp32",
    threads: Annotated[int | None, typer.Option(
        min=1, help="Threads the host profile assumes (its calibration).")] = None,
    cached_until: Annotated[str | None, typer.Option(
        help="What if every node up to this one were cached (node, tensor or module path)?")
                            ] = None,
    from_node: Annotated[str | None, typer.Option("--from", help="Cost of the subgraph from "
                                                  "this node ...")] = None,
    to_node: Annotated[str | None, typer.Option("--to", help="... to this one.")] = None,
    plus: Annotated[Path | None, typer.Option(
        help="Add another model's cost (e.g. a student model) to the what-if.")] = None,
    strict: Annotated[bool, typer.Option(help="Fail on ops with no cost formula.")] = False,
    top: Annotated[int, typer.Option(min=1, help="Groups to list.")] = 10,
    flops_per_mac: Annotated[int, typer.Option(
        min=1, max=2, help="FLOPs per multiply-accumulate: 2 (default) or 1.")] = 2,
    image_size: ImageSizeOpt = None,
    keep_batchnorm: KeepBnOpt = False,
    opset: OpsetOpt = None,
    max_tensor_bytes: Annotated[int, typer.Option(
        help="Refuse models with a tensor larger than this.")] = 1 << 38,
    debug: DebugOpt = False,
) -> None:
    """Costs, fused groups and memory of a model; estimates on hardware; what-if."""
    _run(debug, _analyze, model, json_path=json_path, csv_path=csv_path, html_path=html_path,
         netron_path=netron_path, batch=batch,
         input_shape=input_shape, image_size=image_size, keep_batchnorm=keep_batchnorm,
         opset=opset, top=top, precision=precision, hardware=hardware or [], threads=threads,
         cached_until=cached_until, from_node=from_node, to_node=to_node, plus=plus,
         strict=strict, flops_per_mac=flops_per_mac, max_tensor_bytes=max_tensor_bytes)


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


@app.command("report")
def report_command(
    analysis: Annotated[Path, typer.Argument(help="A JSON file written by `analyze --json`.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The .html file to write.")],
    debug: DebugOpt = False,
) -> None:
    """Render the HTML report of a saved analysis."""
    from .reports.html import load_analysis_json, write_html

    _run(debug, lambda: write_html(load_analysis_json(analysis), output))
    Console(highlight=False).print(f"wrote {output}")


@app.command("hardware")
def hardware_command(
    threads: Annotated[int | None, typer.Option(min=1, help="Threads for the host profile.")
                       ] = None,
    debug: DebugOpt = False,
) -> None:
    """List the hardware profiles with their key numbers and sources."""
    from .analyzer.estimate import resolve_target
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
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    single.command()(analyze_command)
    single()


if __name__ == "__main__":
    sys.exit(main())
