"""Experiment tracking types: experiments, runs, metric points, and the checks on what users
log. Frozen values and pure functions; the stores and ``shoal.experiments`` do the I/O.

Metrics belong to an *owner* string, so one table serves runs (``run:<experiment>/<run>``) and
jobs (``job:<name>``).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from shoal.errors import InvalidArgumentError

__all__ = [
    "NAME_MAX_LENGTH",
    "ExperimentRecord",
    "MetricPoint",
    "MetricSummary",
    "ParameterValue",
    "RunArtifact",
    "RunRecord",
    "RunStatus",
    "check_metric_name",
    "check_metric_value",
    "check_name",
    "check_parameter",
    "job_owner",
    "run_owner",
]

#: SageMaker's limit for experiment and run names.
NAME_MAX_LENGTH = 120
_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,119}")
_METRIC_NAME_MAX = 255

ParameterValue = str | int | float | bool


class RunStatus(StrEnum):
    """SageMaker's trial-component statuses. A run may be resumed (``load_run``) after it
    ended, so unlike jobs there is no one-way transition table."""

    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"

    @property
    def is_terminal(self) -> bool:
        return self is not RunStatus.IN_PROGRESS


def run_owner(experiment_name: str, run_name: str) -> str:
    """The metrics owner of a run: ``run:<experiment>/<run>``."""
    return f"run:{experiment_name}/{run_name}"


def job_owner(job_name: str) -> str:
    """The metrics owner of a job: ``job:<name>``."""
    return f"job:{job_name}"


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One logged value. *timestamp* is epoch seconds; *step* is optional."""

    name: str
    value: float
    timestamp: float
    step: int | None = None


@dataclass(frozen=True, slots=True)
class MetricSummary:
    """Statistics of one metric series (SageMaker's Min/Max/Avg/Last/Count)."""

    name: str
    count: int
    min: float
    max: float
    avg: float
    last: float


@dataclass(frozen=True, slots=True)
class RunArtifact:
    """An input or output of a run: a value (usually a URI) and what kind of thing it is."""

    name: str
    value: str
    media_type: str | None = None
    is_output: bool = True
    #: ``ConfusionMatrix``, ``PrecisionRecallCurve``, ``ROCCurve`` for logged graphs.
    artifact_type: str | None = None


@dataclass(frozen=True, slots=True)
class ExperimentRecord:
    name: str
    display_name: str | None
    created_at: datetime
    tags: Mapping[str, str] = field(default_factory=dict)
    run_count: int = 0
    #: The user who created it (``local`` without a team server, and for rows older than
    #: schema 0007).
    owner: str = "local"


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A persisted snapshot of one run (metrics are read separately, by owner)."""

    experiment_name: str
    run_name: str
    display_name: str | None
    status: RunStatus
    created_at: datetime
    ended_at: datetime | None = None
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    jobs: tuple[str, ...] = ()
    artifacts: tuple[RunArtifact, ...] = ()
    #: The user who created it (``local`` without a team server, and for rows older than
    #: schema 0007).
    owner: str = "local"

    @property
    def metrics_owner(self) -> str:
        """The key of the run's metric series (``run:<experiment>/<run>``)."""
        return run_owner(self.experiment_name, self.run_name)


# --- checks on what users pass -------------------------------------------------------------

def check_name(kind: str, value: object) -> str:
    """An experiment or run name in SageMaker's charset, or InvalidArgumentError."""
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{kind} must be a non-empty string, got {value!r}",
                                   argument=kind)
    # Length first: the pattern's nested repetition is slow on very long input.
    if len(value) > NAME_MAX_LENGTH or _NAME.fullmatch(value) is None:
        raise InvalidArgumentError(
            f"{kind} {value!r} is not a valid name: use letters, digits and single or repeated "
            f"hyphens, start and end with a letter or digit, at most {NAME_MAX_LENGTH} "
            "characters (SageMaker's rule)", argument=kind, value=value)
    return value


def check_metric_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > _METRIC_NAME_MAX:
        raise InvalidArgumentError(f"a metric name must be a non-empty string of at most "
                                   f"{_METRIC_NAME_MAX} characters, got {name!r}",
                                   argument="name")
    return name


def _as_real(value: object) -> float | None:
    """*value* as a float when it is a real number (numpy and torch scalars too), else None."""
    if type(value) is float:  # the common case first: log_metric is a hot path
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)  # numpy 0-d arrays, torch scalar tensors
    if item is not None and getattr(value, "ndim", None) == 0:
        try:
            inner = item()
        except (TypeError, ValueError, RuntimeError):
            return None
        if isinstance(inner, numbers.Real) and not isinstance(inner, bool):
            return float(inner)
    return None


def check_metric_value(name: str, value: object) -> float:
    """*value* as a finite float, or InvalidArgumentError naming the metric.

    NaN, ±inf, booleans and anything that is not a real number are refused: a stored NaN
    would poison every Min/Max/Avg computed from the series.
    """
    number = _as_real(value)
    if number is None:
        raise InvalidArgumentError(
            f"metric {name!r}: value {value!r} ({type(value).__name__}) is not a number; "
            "log_metric takes an int or a float", metric=name, value=repr(value))
    if not math.isfinite(number):
        raise InvalidArgumentError(
            f"metric {name!r}: value {number!r} is not finite; NaN and infinity are not "
            "stored (check the computation that produced it)", metric=name, value=repr(value))
    return number


def check_parameter(name: object, value: object) -> ParameterValue:
    """A parameter value as str, int, float or bool (numpy scalars unwrapped)."""
    if not isinstance(name, str) or not name.strip() or len(name) > _METRIC_NAME_MAX:
        raise InvalidArgumentError(f"a parameter name must be a non-empty string of at most "
                                   f"{_METRIC_NAME_MAX} characters, got {name!r}",
                                   argument="name")
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, numbers.Integral):  # int, numpy integers
        return int(value)
    number = _as_real(value)
    if number is not None:
        if not math.isfinite(number):
            raise InvalidArgumentError(f"parameter {name!r}: value {number!r} is not finite",
                                       parameter=name)
        return number
    raise InvalidArgumentError(
        f"parameter {name!r}: value {value!r} ({type(value).__name__}) must be a str, int, "
        "float or bool; convert it first (for example str(value))", parameter=name)
