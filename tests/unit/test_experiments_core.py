"""What users may log: names, metric values, parameters; and the metric owners."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from shoal.core.experiments import (
    RunRecord,
    RunStatus,
    check_metric_name,
    check_metric_value,
    check_name,
    check_parameter,
    job_owner,
    run_owner,
)
from shoal.errors import InvalidArgumentError


def test_owners() -> None:
    assert run_owner("mnist", "lr-0-1") == "run:mnist/lr-0-1"
    assert job_owner("train-250301-120000-ab12cd") == "job:train-250301-120000-ab12cd"


def test_run_record_owner_and_status() -> None:
    from datetime import UTC, datetime

    rec = RunRecord("e", "r", None, RunStatus.IN_PROGRESS, datetime.now(UTC))
    assert rec.metrics_owner == run_owner("e", "r")
    assert not RunStatus.IN_PROGRESS.is_terminal
    assert all(s.is_terminal for s in RunStatus if s is not RunStatus.IN_PROGRESS)


@pytest.mark.parametrize("name", ["a", "A1", "my-exp", "a--b", "x" * 120, "0-9"])
def test_valid_names(name: str) -> None:
    assert check_name("experiment_name", name) == name


@pytest.mark.parametrize("name", ["", "-a", "a-", "a_b", "a b", "a/b", "x" * 121, "ü", None, 3,
                                  "a" + "-" * 5000 + "!"])
def test_invalid_names_name_the_argument(name: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_name("run_name", name)
    assert "run_name" in str(info.value)
    assert info.value.details["argument"] == "run_name"


@pytest.mark.parametrize("value, expected", [
    (1, 1.0), (0.25, 0.25), (-3, -3.0), (np.float32(0.5), 0.5), (np.int64(7), 7.0),
    (np.float64(2.5), 2.5), (np.array(1.5), 1.5), (Fraction(1, 4), 0.25), (1e308, 1e308),
])
def test_metric_values_become_floats(value: object, expected: float) -> None:
    got = check_metric_value("loss", value)
    assert type(got) is float and got == expected


@pytest.mark.parametrize("value, words", [
    (float("nan"), "not finite"), (float("inf"), "not finite"), (-math.inf, "not finite"),
    (np.float64("nan"), "not finite"), (True, "not a number"), (np.bool_(False), "not a number"),
    ("abc", "not a number"), ("1.0", "not a number"), (None, "not a number"),
    ([1.0], "not a number"), (np.array([1.0, 2.0]), "not a number"), (1 + 2j, "not a number"),
    (Decimal("1.5"), "not a number"),
])
def test_bad_metric_values_name_the_metric(value: object, words: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_metric_value("val-loss", value)
    assert "'val-loss'" in str(info.value) and words in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["", "   ", None, 1, "x" * 256])
def test_bad_metric_names(name: object) -> None:
    with pytest.raises(InvalidArgumentError, match="metric name"):
        check_metric_name(name)


@pytest.mark.parametrize("value, expected", [
    ("adam", "adam"), (3, 3), (0.1, 0.1), (True, True), (np.int32(4), 4), (np.float32(0.5), 0.5),
])
def test_parameters_keep_their_type(value: object, expected: object) -> None:
    got = check_parameter("p", value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), None, [1], {"a": 1}, object()])
def test_bad_parameters(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="'p'"):
        check_parameter("p", value)
