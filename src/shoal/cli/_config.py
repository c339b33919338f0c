"""``shoal config show``: every setting and default with where it came from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shoal.cli._context import emit, out, state
from shoal.cli._render import key_values, mask_env

if TYPE_CHECKING:
    from shoal._internal.settings import Settings
    from shoal.session import Session

__all__ = ["app"]

app = typer.Typer(help="Show shoal's configuration.", no_args_is_help=True,
                  rich_markup_mode=None)


def _display(key: str, value: object) -> object:
    """A setting's value as shown: URLs without passwords, env values of secrets masked."""
    if key == "EnvironmentVariables" and isinstance(value, dict):
        return mask_env(value)
    if key in ("metadata_url", "artifact_url") and isinstance(value, str):
        from shoal.storage.sql import redact_url

        return redact_url(value)
    if isinstance(value, Path):
        return str(value)
    return value


def _settings_rows(settings: Settings) -> list[dict[str, Any]]:
    rows = []
    resolved = {"metadata_url": settings.resolved_metadata_url(),
                "artifact_url": settings.resolved_artifact_url(),
                "admin_config_override": settings.admin_config_path(),
                "user_config_override": settings.user_config_path()}
    for name, source in settings.sources().items():
        value = getattr(settings, name)
        if name == "home" and state.home is not None:
            source = "argument --home"  # Settings.sources() says env when SHOAL_HOME is also set
        row = {"name": name, "value": _display(name, value), "source": source}
        if value is None and name in resolved:
            row["effective"] = _display(name, resolved[name])
        rows.append(row)
    return rows


def _files(session: Session, extra: list[Path]) -> list[dict[str, Any]]:
    used = set(session.defaults.files)
    candidates = [("admin", session.settings.admin_config_path()),
                  ("user", session.settings.user_config_path())]
    candidates += [("extra", p) for p in extra]
    return [{"label": label, "path": str(path), "found": f"{label}:{path}" in used}
            for label, path in candidates]


def _resolved(section: Any) -> list[dict[str, Any]]:
    return [{"key": key, "value": _display(key, item.value), "source": item.source}
            for key, item in sorted(section.items())]


@app.command()
def show(
    config: Annotated[list[Path] | None, typer.Option(
        "--config", "-c", help="An extra SageMaker-schema defaults file (repeatable; "
                               "later files win).", dir_okay=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Every setting with its source, the defaults files read, and each resolved default."""
    extra = [p.expanduser().resolve() for p in config or ()]
    session = state.session(config_files=extra)
    defaults = session.defaults  # reads and validates the files: ConfigError names file and key
    data = {"settings": _settings_rows(session.settings), "files": _files(session, extra),
            "remote_function": _resolved(defaults.remote_function),
            "session": _resolved(defaults.session)}
    if as_json:
        print(json.dumps(data, indent=2, default=str))
        return
    _print_tables(data)


def _print_tables(data: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    console = out()
    settings = Table(title="Settings (--home > SHOAL_* environment > default)", title_justify="left",
                     box=None, header_style="bold", pad_edge=False)
    for column in ("SETTING", "VALUE", "SOURCE"):
        settings.add_column(column, no_wrap=column != "VALUE")
    for row in data["settings"]:
        value = "-" if row["value"] is None else str(row["value"])
        if "effective" in row:
            value = f"{row['effective']} (derived)"
        settings.add_row(row["name"], value, row["source"])
    emit(settings)
    console.print()
    console.print("Defaults files (admin < user < --config, later wins)", style="bold")
    emit(key_values([
        (f["label"], Text(f["path"]) + Text("  found" if f["found"] else "  not found",
                                            style="green" if f["found"] else "dim"))
        for f in data["files"]]))
    for title, key in (("SageMaker.PythonSDK.Modules.RemoteFunction", "remote_function"),
                       ("SageMaker.PythonSDK.Modules.Session", "session")):
        console.print()
        rows = data[key]
        if not rows:
            console.print(f"{title}: (nothing set)", style="bold")
            continue
        table = Table(title=title, title_justify="left", box=None, header_style="bold",
                      pad_edge=False)
        table.add_column("KEY", no_wrap=True)
        table.add_column("VALUE")
        table.add_column("SOURCE", no_wrap=True)
        for row in rows:
            table.add_row(row["key"], json.dumps(row["value"], default=str)
                          if not isinstance(row["value"], str) else row["value"], row["source"])
        emit(table)
