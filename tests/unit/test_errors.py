"""The error tree: every error pickles, and codes map back to classes."""

from __future__ import annotations

import pickle

import pytest

import shoal.errors as errors_module
from shoal.errors import ShoalError, error_class_for_code


def _all_error_classes() -> list[type[ShoalError]]:
    seen: list[type[ShoalError]] = []
    todo = [ShoalError]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    # Only shoal's own tree: tests elsewhere may subclass errors for their own use.
    return sorted((c for c in seen if c.__module__ == "shoal.errors"), key=lambda c: c.__name__)


ERROR_CLASSES = _all_error_classes()


def test_every_error_class_is_exported() -> None:
    exported = {getattr(errors_module, n) for n in errors_module.__all__}
    assert set(ERROR_CLASSES) <= exported
    assert len(ERROR_CLASSES) >= 30


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_error_pickles_round_trip(cls: type[ShoalError]) -> None:
    err = cls("something went wrong", job="job-1", path="/a/b", attempt=3,
              nested={"k": [1, 2]})
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(err, protocol=protocol))
        assert type(back) is cls
        assert back.message == "something went wrong"
        assert str(back) == "something went wrong"
        assert back.args == err.args
        assert back.details == {"job": "job-1", "path": "/a/b", "attempt": 3,
                                "nested": {"k": [1, 2]}}


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_error_without_details_pickles(cls: type[ShoalError]) -> None:
    back = pickle.loads(pickle.dumps(cls("plain")))
    assert type(back) is cls and back.details == {} and str(back) == "plain"


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_error_class_for_code_maps_back(cls: type[ShoalError]) -> None:
    assert error_class_for_code(cls.code) is cls


def test_codes_are_unique() -> None:
    codes = [c.code for c in ERROR_CLASSES]
    assert len(codes) == len(set(codes)), sorted(c for c in codes if codes.count(c) > 1)


def test_http_status_is_a_client_or_server_error() -> None:
    for cls in ERROR_CLASSES:
        assert 400 <= cls.http_status < 600, cls


def test_unknown_code_maps_to_the_base() -> None:
    assert error_class_for_code("NO_SUCH_CODE") is ShoalError


def test_invalid_argument_is_also_a_value_error() -> None:
    from shoal.errors import InvalidArgumentError, PicklingError

    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(PicklingError, ValueError)


def test_cause_is_kept_in_process() -> None:
    try:
        try:
            raise KeyError("x")
        except KeyError as e:
            raise errors_module.JobNotFound("no job", job="j") from e
    except errors_module.JobNotFound as err:
        assert isinstance(err.__cause__, KeyError)
