"""``shoal bundle build|verify``: a model as a self-contained app for Azure Functions, AWS
Lambda, a container or any ASGI server, and the check that it runs there as it ran here."""

from __future__ import annotations

import warnings
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from shoal.cli._context import ExitCode, err, out, state

__all__ = ["app", "describe_record", "describe_report", "size_text"]

app = typer.Typer(help="Build and verify portable deployment bundles (they never import shoal).",
                  no_args_is_help=True, rich_markup_mode=None)


# typer wants enums for choices; these mirror shoal.bundles' (imported only inside commands).
class _Target(StrEnum):
    AZURE_FUNCTIONS = "azure-functions"
    AWS_LAMBDA = "aws-lambda"
    CONTAINER = "container"
    ASGI = "asgi"


class _Auth(StrEnum):
    ANONYMOUS = "anonymous"
    FUNCTION = "function"
    ADMIN = "admin"


class _Map(StrEnum):
    ARGMAX = "argmax"
    IDENTITY = "identity"


def size_text(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} KB"


@app.command()
def build(
    model: Annotated[str, typer.Argument(
        help="A model directory or file (model.onnx, model.joblib), a model.tar.gz path or "
             "URI, or a completed training job's name.")],
    target: Annotated[_Target, typer.Option("--target", "-t", help="The platform.")],
    output: Annotated[Path, typer.Option(
        "--output", "-o", help="Where the bundle goes: a directory, or a .zip file.")],
    route: Annotated[str, typer.Option(
        help="HTTP route (Azure: /api/ROUTE; asgi and container: /ROUTE besides "
             "/invocations).")] = "classify",
    auth_level: Annotated[_Auth | None, typer.Option(
        "--auth-level", help="Azure Functions auth level (default: function, a key is "
                             "needed).")] = None,
    output_map: Annotated[_Map | None, typer.Option(
        "--output-map", help="argmax: class indices (default for scores over classes); "
                             "identity: the first output as it is.")] = None,
    output_key: Annotated[str | None, typer.Option(
        "--output-key", help="The answer's key (default: digits for argmax, else "
                             "predictions).")] = None,
    quantize: Annotated[bool | None, typer.Option(
        "--quantize/--no-quantize", help="Store Conv/Gemm/MatMul weights as int8 (default: "
                                         "when they exceed 1 MiB). Compute stays float32.")
    ] = None,
    samples: Annotated[Path | None, typer.Option(
        "--samples", help="A .npy/.npz file of real inputs for the parity check (default: "
                          "random inputs).", exists=True, dir_okay=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.")] = False,
) -> None:
    """Build a self-contained deployment bundle of MODEL for one platform."""
    from shoal.bundles import BundleWarning, build_bundle

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BundleWarning)  # printed below, once, in yellow
        record = build_bundle(model, target=target.value, output=output, force=force,
                              session=state.session(), route=route,
                              auth_level=auth_level.value if auth_level else None,
                              output_map=output_map.value if output_map else None,
                              output_key=output_key, quantize=quantize, samples=samples)
    describe_record(record)
    readme = ("README.md in the zip" if record.path.suffix == ".zip"
              else f"{record.path / 'README.md'}")
    out().print(Text(f"   next: shoal {state.home_option()}bundle verify {record.path}; to "
                     f"deploy, see {readme}", style="dim"))


def describe_record(record: Any) -> None:
    """Print what a build made: size, weights and parity, requirements, warnings."""
    p = record.parity
    out().print(Text(f"built {record.target} bundle {record.path}: "
                     f"{size_text(record.zipped_bytes)} zipped ({size_text(record.size_bytes)} of files, "
                     f"{len(record.files)} files) in {record.seconds:.1f}s", style="bold"))
    parity = (f"{p.agreement:.1%} of {p.samples} predictions agree with the source"
              if p.agreement is not None else f"{p.samples} samples")
    out().print(Text(f"   model: {record.model_type} ({record.source}), {record.weights} "
                     f"weights; {parity}, max |Δ| {p.max_abs_diff or 0:.2g}"))
    out().print(Text(f"   requirements: {', '.join(record.requirements)}", style="dim"))
    for note in record.warnings:
        err().print(Text(f"warning: {note}", style="yellow"))


def describe_report(report: Any) -> None:
    """Print what a verify found, one line per check."""
    for check in report.checks:
        mark = Text("  ok  ", style="green") if check.ok else Text(" FAIL ", style="bold red")
        out().print(mark + Text(f"{check.name}: {check.detail}"))
    env = "reused" if report.env_cached else "built"
    out().print(Text(f"   environment {report.environment} ({env} in {report.env_seconds:.1f}s); "
                     f"bundle + requirements {size_text(report.installed_bytes)}; answered in "
                     f"{report.run_seconds:.1f}s", style="dim"))
    for note in report.warnings:
        err().print(Text(f"warning: {note}", style="yellow"))


@app.command()
def verify(
    bundle: Annotated[Path, typer.Argument(help="A bundle directory or .zip.", exists=True)],
    timeout: Annotated[float, typer.Option(help="Seconds for the bundle to load and answer.")
                       ] = 180.0,
) -> None:
    """Install BUNDLE's requirements into a fresh virtualenv, run it as its platform would,
    send sample requests and compare the answers with the source model."""
    from shoal.bundles import verify_bundle

    report = verify_bundle(bundle, session=state.session(), timeout=timeout)
    describe_report(report)
    if not report.ok:
        failed = [c.name for c in report.checks if not c.ok]
        err().print(Text(f"error: {report.target} bundle {bundle} failed {len(failed)} "
                         f"check(s): {', '.join(failed)}", style="bold red"))
        raise typer.Exit(ExitCode.ERROR)
    out().print(Text(f"verified: the {report.target} bundle answers as the source model "
                     f"({report.weights} weights)", style="bold green"))
