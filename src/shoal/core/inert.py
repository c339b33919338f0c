"""SageMaker settings that shoal accepts but cannot honour here ("inert" settings).

They are kept on the job or endpoint record (``inert_settings``) and reported once per session
with a warning, so SageMaker code runs unchanged and nobody is misled into thinking a VPC, a
KMS key or a spot instance was used.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["given", "jsonable", "report_inert"]


def _is_default(value: Any, default: Any) -> bool:
    if value is None or value is False:
        return True
    value = getattr(value, "value", value)  # SageMaker's enums (EndpointType.MODEL_BASED)
    return bool(value == default)


def given(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of *values* named in *defaults* whose value was set: not None, not False
    and not SageMaker's default; JSON-safe, ready for a record."""
    return {name: jsonable(values[name]) for name, default in defaults.items()
            if name in values and not _is_default(values[name], default)}


def jsonable(value: Any) -> Any:
    """*value* if it survives JSON, else its repr (a Rule, a DataCaptureConfig...)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def report_inert(report: Callable[[str, str], None], settings: Mapping[str, Any],
                 backend: str, what: str) -> None:
    """Warn once per session (``Session.report_inert``) for each setting in *settings*."""
    for key, value in settings.items():
        report(key, f"{key}={value!r} has no effect on the {backend} backend; it is kept on "
                    f"the {what} record")
