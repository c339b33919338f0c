"""The checks an estimator makes before anything starts: counts, code, hyperparameters and
metric definitions, each failing with what was wrong and what to write instead."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shoal.errors import InvalidArgumentError
from shoal.jobs.options import positive

__all__ = ["check_code", "check_hyperparameters", "check_metrics", "positive"]

_FLAG = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def check_code(entry_point: str | None, source_dir: str | None) -> tuple[str, Path | None]:
    if not entry_point:
        raise InvalidArgumentError("entry_point is required: the training script to run, e.g. "
                                   "entry_point='train.py' (relative to source_dir when given)",
                                   argument="entry_point")
    from shoal.endpoints.model import check_code as check_model_code

    checked, src = check_model_code(entry_point, source_dir)
    return str(checked), src


def check_hyperparameters(hps: Mapping[str, Any] | None) -> dict[str, Any]:
    if hps is None:
        return {}
    if not isinstance(hps, Mapping):
        raise InvalidArgumentError("hyperparameters must be a dict", argument="hyperparameters")
    for key, value in hps.items():
        if not isinstance(key, str) or not _FLAG.match(key):
            raise InvalidArgumentError(
                f"hyperparameter name {key!r} cannot be a command-line flag (--{key}); use "
                "letters, digits, '_', '-' or '.', starting with a letter or '_'",
                argument="hyperparameters", key=str(key))
        try:
            json.dumps(value)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"hyperparameter {key!r}: value {value!r} is not JSON "
                                       f"serializable ({e})", key=key) from e
    return dict(hps)


def check_metrics(defs: list[Mapping[str, str]] | None) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for d in defs or ():
        if not isinstance(d, Mapping) or not isinstance(d.get("Name"), str) or not d["Name"] \
                or not isinstance(d.get("Regex"), str):
            raise InvalidArgumentError(
                f'metric definition {d!r} must be {{"Name": "...", "Regex": "..."}}',
                argument="metric_definitions")
        try:
            compiled = re.compile(d["Regex"])
        except re.error as e:
            raise InvalidArgumentError(
                f"metric {d['Name']!r}: regex {d['Regex']!r} does not compile: {e}",
                argument="metric_definitions", metric=d["Name"]) from e
        if compiled.groups < 1:
            raise InvalidArgumentError(
                f"metric {d['Name']!r}: regex {d['Regex']!r} needs a capture group around the "
                "value, e.g. 'loss=([0-9.]+)'", argument="metric_definitions", metric=d["Name"])
        out.append({"Name": d["Name"], "Regex": d["Regex"]})
    return out
