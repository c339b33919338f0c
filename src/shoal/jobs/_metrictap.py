"""A training job's metrics as its supervisor finds them in the output (SageMaker's metric
definitions), written in batches, and kept while the metadata store does not answer.

While the job runs a batch is written without waiting out an outage (the supervisor goes on
draining the job's output meanwhile): a store that does not answer leaves the batch pending,
and the next flush tries again. The last flush, after the job's process ended, waits out the
outage as every supervisor write does (``storage/outage.py``). A write whose answer was lost
may have been committed: before a batch is written again, the points the store already holds
(same name, value, timestamp and step) are left out, so none is stored twice.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field

from shoal.core.experiments import MetricPoint
from shoal.core.ports import MetricStore
from shoal.errors import StorageError

__all__ = ["MetricTap"]

logger = logging.getLogger(__name__)


def _transient(error: StorageError) -> bool:
    return bool(error.details.get("transient"))


@dataclass
class MetricTap:
    """Applies the metric regexes to the output as it streams; flushes in batches."""

    definitions: list[tuple[str, re.Pattern[bytes]]]
    owners: tuple[str, ...]
    metadata: MetricStore
    partial: bytes = b""
    #: Points found and not yet stored, per owner (each owner's write is its own).
    waiting: dict[str, list[MetricPoint]] = field(default_factory=dict)
    #: Owners whose last write failed after it may have been committed.
    uncertain: set[str] = field(default_factory=set)
    last_flush: float = 0.0
    stored: int = 0

    @property
    def pending(self) -> bool:
        return any(self.waiting.values())

    def feed(self, data: bytes) -> None:
        if not self.definitions:
            return
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > 65536:  # a line without end: match what there is
            lines.append(self.partial)
            self.partial = b""
        now = time.time()
        for line in lines:
            self._match(line, now)

    def _match(self, line: bytes, now: float) -> None:
        for name, regex in self.definitions:
            m = regex.search(line)
            if m is None:
                continue
            text = m.group(1) if regex.groups else m.group(0)
            try:
                value = float(text)
            except (TypeError, ValueError):
                continue
            if value != value or value in (float("inf"), float("-inf")):
                continue
            point = MetricPoint(name=name, value=value, timestamp=now, step=None)
            for owner in self.owners:
                self.waiting.setdefault(owner, []).append(point)

    def flush(self, *, final: bool = False) -> None:
        """Write what is pending. While the job runs (not *final*) a store that does not
        answer keeps the points for the next flush; *final* tries again for as long as the
        store's outage limit allows, then raises its error."""
        if final and self.partial:
            self._match(self.partial, time.time())
            self.partial = b""
        self.last_flush = time.monotonic()
        # The store itself: a retried write must leave out what its first try stored, which
        # the outage-tolerant store's own retry of add_metrics could not.
        store: MetricStore = getattr(self.metadata, "inner", self.metadata)
        limit = float(getattr(self.metadata, "seconds", 0.0)) if final else 0.0
        deadline = time.monotonic() + limit
        pause = 0.2
        for owner, points in list(self.waiting.items()):
            while points:
                try:
                    self._write(store, owner, points)
                    break
                except StorageError as e:
                    if not _transient(e):
                        raise
                    if owner not in self.uncertain:
                        logger.warning("metrics of %s could not be stored (%s); %d point(s) "
                                       "are kept and written when the store answers", owner,
                                       e, len(points))
                    self.uncertain.add(owner)
                    if not final:
                        break
                    if time.monotonic() + pause > deadline:
                        raise
                time.sleep(pause)  # the store's outage, at the job's end: bounded pauses
                pause = min(pause * 2, 2.0)

    def _write(self, store: MetricStore, owner: str, points: list[MetricPoint]) -> None:
        if owner in self.uncertain:  # the failed try may have stored some: not twice
            held = {(p.name, p.value, p.timestamp, p.step) for p in store.get_metrics(owner)}
            points = [p for p in points if (p.name, p.value, p.timestamp, p.step) not in held]
        store.add_metrics(owner, points)
        self.uncertain.discard(owner)
        self.waiting[owner] = []
        if owner == self.owners[0]:
            self.stored += len(points)
