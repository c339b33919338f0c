"""The console's templates (Jinja2, every value escaped) and the small formatting helpers
they use; no routes here."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse

from shoal.core.secrets import MASK, is_secret_name

if TYPE_CHECKING:
    from jinja2 import Environment

__all__ = ["ago", "base_url", "masked", "page", "seconds", "spec_json"]

_TEMPLATES = Path(__file__).parent / "templates"

@functools.cache
def _env() -> Environment:
    """The templates, loaded on first use (importing jinja2 costs start-up time)."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    # Autoescape for every template, whatever its file name; undefined names are errors.
    return Environment(loader=FileSystemLoader(_TEMPLATES), autoescape=select_autoescape(
        default=True, default_for_string=True), undefined=StrictUndefined, trim_blocks=True,
        lstrip_blocks=True)


def page(request: Request, template: str, status_code: int = 200,
         **context: Any) -> HTMLResponse:
    """*template* rendered with the request's console context (its base URL, who is signed
    in and the CSRF token, which the console's middleware put on ``request.state``)."""
    state = request.state
    html = _env().get_template(template).render(
        base=base_url(request), principal=getattr(state, "principal", None),
        csrf=getattr(state, "csrf", ""), login_required=getattr(state, "login_required", False),
        **context)
    return HTMLResponse(html, status_code=status_code)


def base_url(request: Request) -> str:
    """Where the console is mounted ("" at the root, "/console" in ``shoal server``)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def seconds(value: float | None) -> str:
    """A duration as people read it: ``850 ms``, ``42 s``, ``3 m 05 s``, ``2 h 07 m``."""
    if value is None:
        return ""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.0f} s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes} m {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} m"
    return f"{hours // 24} d {hours % 24:02d} h"


def ago(moment: datetime | None, now: datetime) -> str:
    return "" if moment is None else seconds(max(0.0, (now - moment).total_seconds()))


def masked(value: Any) -> Any:
    """*value* with the value of every key that names a secret (``*_TOKEN``, ``PASSWORD``…)
    replaced by ``****``, at any depth."""
    if isinstance(value, Mapping):
        return {k: MASK if isinstance(k, str) and is_secret_name(k) and v not in (None, "")
                else masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [masked(v) for v in value]
    return value


def spec_json(spec: Mapping[str, Any]) -> str:
    return json.dumps(masked(spec), indent=2, sort_keys=True, default=str)
