"""A training job's metrics while the metadata store does not answer (issue #23): kept, not
waited for while the job runs, and written once when the store is back, never twice."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

import pytest

from shoal.core.experiments import MetricPoint
from shoal.errors import MetadataStoreError
from shoal.jobs._metrictap import MetricTap
from shoal.storage.outage import tolerant
from shoal.storage.sql import SqlMetadataStore


class _Blinking:
    """A real SQLite store that, while *down*, does not answer, as PostgreSQL stopped would
    (a stand-in: the lost answer of a committed write cannot be produced on demand with a
    real server). With *lose_answer* a write is committed and its answer then lost."""

    def __init__(self, store: SqlMetadataStore) -> None:
        self.store = store
        self.down = False
        self.lose_answer = False

    def _unreachable(self) -> MetadataStoreError:
        return MetadataStoreError("connection refused (the test's outage)", transient=True)

    def add_metrics(self, owner: str, points: Sequence[MetricPoint]) -> None:
        if self.down:
            raise self._unreachable()
        self.store.add_metrics(owner, points)
        if self.lose_answer:
            self.lose_answer = False
            raise self._unreachable()

    def get_metrics(self, owner: str, name: str | None = None) -> list[MetricPoint]:
        if self.down:
            raise self._unreachable()
        return self.store.get_metrics(owner, name)


@pytest.fixture
def blinking(tmp_path):
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'meta.db'}", create=True)
    try:
        yield _Blinking(store)
    finally:
        store.close()


def _tap(blinking: _Blinking, seconds: float = 30) -> MetricTap:
    return MetricTap([("loss", re.compile(rb"loss=([0-9.]+)"))], ("job:j", "run:e/r"),
                     tolerant(blinking, seconds=seconds, shown="the test's store"))


def test_metrics_are_kept_while_the_store_is_away_and_written_once_it_is_back(blinking):
    tap = _tap(blinking)
    blinking.down = True
    tap.feed(b"loss=0.5\nloss=0.25\n")
    started = time.monotonic()
    tap.flush()  # while the job runs: not held up by the outage (its output keeps draining)
    assert time.monotonic() - started < 5
    assert tap.pending
    tap.feed(b"loss=0.125\n")
    blinking.down = False
    tap.flush()
    for owner in ("job:j", "run:e/r"):
        assert [p.value for p in blinking.store.get_metrics(owner)] == [0.5, 0.25, 0.125]
    assert not tap.pending


def test_a_write_whose_answer_was_lost_is_not_stored_twice(blinking):
    tap = _tap(blinking)
    tap.feed(b"loss=0.5\n")
    blinking.lose_answer = True  # committed, then the connection went
    tap.flush()
    assert tap.pending  # the tap cannot know it was stored
    tap.feed(b"loss=0.25\n")
    tap.flush(final=True)
    assert [p.value for p in blinking.store.get_metrics("job:j")] == [0.5, 0.25]
    assert [p.value for p in blinking.store.get_metrics("run:e/r")] == [0.5, 0.25]


def test_the_last_flush_waits_for_the_store_then_names_its_error(blinking):
    tap = _tap(blinking, seconds=1)
    tap.feed(b"loss=0.5\n")
    blinking.down = True
    with pytest.raises(MetadataStoreError, match="the test's outage"):
        tap.flush(final=True)
    blinking.down = False
    tap.flush(final=True)  # nothing was lost meanwhile
    assert [p.value for p in blinking.store.get_metrics("job:j")] == [0.5]
