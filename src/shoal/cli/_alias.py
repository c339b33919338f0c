"""``shoal alias install|uninstall|status``: make ``import sagemaker`` import shoal in this
Python environment (opt-in), for code that cannot be edited.

``install`` writes two files into the environment's site-packages: ``_shoal_sagemaker_alias.py``
(the meta-path finder of ``shoal._sagemaker_alias``) and ``shoal-sagemaker-alias.pth`` (one line
that installs it at startup). It refuses when a real ``sagemaker`` distribution, or any other
``sagemaker`` module, is importable here, naming it: the alias never hides the real SDK.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sysconfig
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli._context import out

__all__ = ["app"]

app = typer.Typer(help="Make 'import sagemaker' import shoal in this environment (opt-in).",
                  no_args_is_help=True, rich_markup_mode=None)

_MODULE = "_shoal_sagemaker_alias.py"
_PTH = "shoal-sagemaker-alias.pth"
_PTH_LINE = "import _shoal_sagemaker_alias; _shoal_sagemaker_alias.install()\n"

TargetOption = Annotated[Path | None, typer.Option(
    "--target", help="site-packages directory to write to (default: this interpreter's).",
    file_okay=False, resolve_path=True)]


def _site(target: Path | None) -> Path:
    return target or Path(sysconfig.get_paths()["purelib"])


def _ours(path: Path) -> bool:
    from shoal._sagemaker_alias import MARKER

    try:
        return MARKER in path.read_text(encoding="utf-8")
    except OSError:
        return False


def _real_sagemaker() -> str | None:
    """What a real SDK looks like here: its distribution, or a ``sagemaker`` module that is
    not the alias; None when there is none."""
    try:
        dist = importlib.metadata.distribution("sagemaker")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        where = dist.locate_file("")
        return f"the 'sagemaker' distribution {dist.version} ({where})"
    spec = importlib.util.find_spec("sagemaker")
    if spec is not None and type(spec.loader).__name__ != "SageMakerAlias":
        return f"a 'sagemaker' module at {spec.origin or spec.submodule_search_locations}"
    return None


@app.command()
def install(target: TargetOption = None) -> None:
    """Write the alias into site-packages (refused when a real sagemaker is installed)."""
    from shoal.errors import ConfigError

    site = _site(target)
    real = _real_sagemaker()
    if real is not None:
        raise ConfigError(f"not installing the sagemaker alias: {real} is installed in this "
                          "environment, and the alias would hide it. Use a separate "
                          "environment for shoal, or 'import shoal as sagemaker'",
                          found=real)
    spec = importlib.util.find_spec("shoal._sagemaker_alias")
    assert spec is not None and spec.origin is not None  # a module of shoal itself
    source = Path(spec.origin)
    site.mkdir(parents=True, exist_ok=True)
    for name, text in ((_MODULE, source.read_text(encoding="utf-8")),
                       (_PTH, f"# {_marker()}: 'import sagemaker' imports shoal\n{_PTH_LINE}")):
        tmp = site / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(site / name)
    out().print(f"installed: 'import sagemaker' now imports shoal in {site} "
                f"({_MODULE}, {_PTH}); 'shoal alias uninstall' removes it")


@app.command()
def uninstall(target: TargetOption = None) -> None:
    """Remove the alias's two files (only files the alias wrote)."""
    site = _site(target)
    removed = []
    for name in (_PTH, _MODULE):
        path = site / name
        if path.exists() and _ours(path):
            path.unlink()
            removed.append(name)
    out().print(f"removed {', '.join(removed)} from {site}" if removed
                else f"no sagemaker alias in {site}")


@app.command()
def status(target: TargetOption = None) -> None:
    """Say whether the alias is installed here, and whether a real sagemaker is."""
    site = _site(target)
    installed = all((site / n).exists() and _ours(site / n) for n in (_PTH, _MODULE))
    out().print(f"alias: {'installed' if installed else 'not installed'} in {site}")
    real = _real_sagemaker()
    out().print(f"real sagemaker: {real or 'none'}")


def _marker() -> str:
    from shoal._sagemaker_alias import MARKER

    return MARKER
