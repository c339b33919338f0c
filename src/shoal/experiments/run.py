"""``Run`` and ``load_run``: SageMaker's experiment tracking (``sagemaker.experiments.run``).

A run records parameters, metrics and artifacts under an experiment. Metrics are checked
when logged and written in batches (one transaction per batch), so a training loop can log
every step. Nothing here touches the stores until a run is entered or first logged to.

Example:
    >>> from shoal.experiments.run import Run, load_run      # doctest: +SKIP
    >>> with Run(experiment_name="mnist", run_name="lr-0-1") as run:
    ...     run.log_parameter("lr", 0.1)
    ...     for step in range(100):
    ...         run.log_metric("loss", 1 / (step + 1), step=step)
"""

from __future__ import annotations

import enum
import json
import math
import mimetypes
import numbers
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.core.experiments import (
    MetricPoint,
    ParameterValue,
    RunArtifact,
    RunStatus,
    check_metric_name,
    check_metric_value,
    check_name,
    check_parameter,
    run_owner,
)
from shoal.errors import AlreadyExistsError, InvalidArgumentError, RunNotFound

if TYPE_CHECKING:
    from shoal.core.ports import ArtifactStore, RunStore
    from shoal.session import Session
from shoal.experiments import _context, _graphs

__all__ = ["Run", "load_run"]

#: Buffered metric points are written when this many are waiting...
FLUSH_POINTS = 1000
#: ... or when the oldest waiting one is this old (checked at each log_metric call).
FLUSH_SECONDS = 1.0


class _Mode(enum.Enum):
    CREATE = "create"  # Run(...): a new run, ended when the block ends
    RESUME = "resume"  # load_run(experiment_name=..., run_name=...): reopened, ended again
    ATTACH = "attach"  # load_run() in a job or inside a block: the run's owner ends it


class Run:
    """One run of an experiment: parameters, metrics and artifacts (SageMaker's ``Run``).

    Use it as a context manager: on leaving the block the buffered metrics are written and the
    run is marked ``Completed``, or ``Failed`` if the block raised (``Stopped`` on Ctrl-C).
    A run name that the experiment already has is refused with AlreadyExistsError;
    ``load_run(experiment_name=..., run_name=...)`` resumes that run instead.

    Args:
        experiment_name: created if it does not exist yet.
        run_name: unique within the experiment; generated (``run-<time>-<hex>``) if omitted.
        experiment_display_name / run_display_name: shown by the CLI and analytics.
        tags: ``[{"Key": ..., "Value": ...}]`` (or a mapping), for the experiment and the run.
        sagemaker_session: a ``shoal.Session``; the default session otherwise.
        artifact_bucket: an fsspec URL (``s3://bucket``, ``file:///dir``) or bucket name for
            logged files; the session's artifact store by default.
        artifact_prefix: key prefix for logged files (default ``experiments``).
    """

    def __init__(self, experiment_name: str, run_name: str | None = None,
                 experiment_display_name: str | None = None,
                 run_display_name: str | None = None,
                 tags: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
                 sagemaker_session: Session | None = None, artifact_bucket: str | None = None,
                 artifact_prefix: str | None = None) -> None:
        self.experiment_name = check_name("experiment_name", experiment_name)
        self.run_name = (check_name("run_name", run_name) if run_name is not None
                         else _new_run_name())
        self.experiment_display_name = experiment_display_name
        self.run_display_name = run_display_name
        self._tags = _tags(tags)
        self._session_arg = sagemaker_session
        self._artifact_bucket = artifact_bucket
        self._artifact_prefix = (artifact_prefix or "experiments").strip("/")
        self._mode = _Mode.CREATE
        self._owner = run_owner(self.experiment_name, self.run_name)
        self._started = False
        self._ended = False
        self._store: RunStore | None = None
        self._artifacts: ArtifactStore | None = None
        self._lock = threading.Lock()
        self._buffer: list[MetricPoint] = []
        self._last_flush = time.monotonic()
        self._metric_names: set[str] = set()
        self._tokens: list[Any] = []

    def __repr__(self) -> str:
        return f"Run(experiment_name={self.experiment_name!r}, run_name={self.run_name!r})"

    # --- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> Run:
        self._start()
        self._tokens.append(_context.enter(self))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: Any) -> None:
        try:
            self.flush()
            if exc_type is None:
                status = RunStatus.COMPLETED
            elif issubclass(exc_type, KeyboardInterrupt):
                status = RunStatus.STOPPED
            else:
                status = RunStatus.FAILED
            self._end(status)
        finally:
            if self._tokens:
                _context.exit_(self._tokens.pop())

    def close(self) -> None:
        """Write the buffered metrics; a run made by ``Run(...)`` or resumed by
        ``load_run(...)`` and used without ``with`` is also marked Completed."""
        self.flush()
        if not self._tokens:
            self._end(RunStatus.COMPLETED)

    def _end(self, status: RunStatus) -> None:
        if self._started and not self._ended and self._mode is not _Mode.ATTACH:
            self._metadata().end_run(self.experiment_name, self.run_name, status=status)
            self._ended = True

    def _start(self) -> None:
        if self._started:
            return
        store = self._metadata()
        if self._mode is _Mode.CREATE:
            store.ensure_experiment(self.experiment_name,
                                    display_name=self.experiment_display_name, tags=self._tags)
            try:
                store.create_run(self.experiment_name, self.run_name,
                                 display_name=self.run_display_name, tags=self._tags)
            except AlreadyExistsError as e:
                raise AlreadyExistsError(
                    f"experiment {self.experiment_name!r} already has a run named "
                    f"{self.run_name!r}. To add to it, use load_run(experiment_name="
                    f"{self.experiment_name!r}, run_name={self.run_name!r}), which resumes it; "
                    "to start another, choose a new run_name (or omit it for a generated one)",
                    experiment=self.experiment_name, run=self.run_name) from e
        self._started = True
        _context.track()

    def _session(self) -> Session:
        from shoal.session import Session, current

        arg = self._session_arg
        return arg if isinstance(arg, Session) else current()

    def _metadata(self) -> RunStore:
        if self._store is None:
            self._store = self._session().runs
        return self._store

    # --- parameters -------------------------------------------------------------------

    def log_parameter(self, name: str, value: ParameterValue) -> None:
        """Record a parameter (str, int, float or bool); a later value replaces it."""
        self.log_parameters({name: value})

    def log_parameters(self, parameters: Mapping[str, ParameterValue]) -> None:
        """Record several parameters at once (one write)."""
        if not isinstance(parameters, Mapping):
            raise InvalidArgumentError(f"log_parameters takes a dict of name -> value, got "
                                       f"{type(parameters).__name__}")
        checked = {name: check_parameter(name, value) for name, value in parameters.items()}
        if checked:
            self._start()
            self._metadata().set_run_parameters(self.experiment_name, self.run_name, checked)

    # --- metrics ----------------------------------------------------------------------

    def log_metric(self, name: str, value: float, timestamp: datetime | float | None = None,
                   step: int | None = None) -> None:
        """Record one value of a metric (SageMaker's argument order).

        The value is checked now (NaN, infinity and non-numbers raise InvalidArgumentError
        and nothing is stored) and written with the next batch.
        """
        if name not in self._metric_names:
            check_metric_name(name)
            self._metric_names.add(name)
        number = value if type(value) is float and math.isfinite(value) else \
            check_metric_value(name, value)
        if step is not None:
            step = _check_step(name, step)
        at = time.time() if timestamp is None else _epoch(name, timestamp)
        if not self._started:
            self._start()
        point = MetricPoint(name, number, at, step)
        with self._lock:
            if not self._buffer:
                _context.hold(self)
            self._buffer.append(point)
            due = (len(self._buffer) >= FLUSH_POINTS
                   or time.monotonic() - self._last_flush >= FLUSH_SECONDS)
        if due:
            self.flush()

    def flush(self) -> None:
        """Write the buffered metric points now (one transaction)."""
        with self._lock:
            points, self._buffer = self._buffer, []
            self._last_flush = time.monotonic()
        if points:
            try:
                self._metadata().add_metrics(self._owner, points)
            except BaseException:
                with self._lock:  # kept for the next flush
                    self._buffer[:0] = points
                raise
        with self._lock:
            if not self._buffer:
                _context.release(self)

    # --- artifacts --------------------------------------------------------------------

    def log_artifact(self, name: str, value: str, media_type: str | None = None,
                     is_output: bool = True) -> None:
        """Record an artifact by value (usually a URI); one of the same name is replaced."""
        _check_artifact_name(name)
        if not isinstance(value, str):
            raise InvalidArgumentError(f"artifact {name!r}: the value must be a string (such as "
                                       f"a URI), got {type(value).__name__}")
        self._start()
        self._metadata().add_run_artifact(self.experiment_name, self.run_name,
                                     RunArtifact(name, value, media_type, bool(is_output)))

    def log_file(self, file_path: str | Path, name: str | None = None,
                 media_type: str | None = None, is_output: bool = True,
                 extra_args: Mapping[str, Any] | None = None) -> str:
        """Upload a file to the artifact store and record it; return its URI.

        It is stored under ``experiments/<experiment>/<run>/<name>`` (name: the file's name).
        *extra_args* are SageMaker's S3 upload arguments: a ``ContentType`` there is the
        media type when none is given; the others (``ServerSideEncryption``...) have no
        effect here and are reported once.
        """
        path = Path(file_path)
        if not path.is_file():
            raise InvalidArgumentError(f"log_file: {file_path} is not a file (looked for "
                                       f"{path.resolve()})", path=str(path))
        name = name or path.name
        _check_artifact_name(name)
        extra = dict(extra_args or {})
        media_type = media_type or extra.pop("ContentType", None) or \
            mimetypes.guess_type(path.name)[0]
        extra.pop("ContentType", None)
        for key, value in extra.items():
            self._session().report_inert(
                f"log_file.{key}", f"log_file(extra_args={{{key!r}: {value!r}}}) has no effect: "
                "the artifact store's own settings apply to the upload")
        uri = self._upload(name, path.read_bytes())
        self._metadata().add_run_artifact(self.experiment_name, self.run_name,
                                     RunArtifact(name, uri, media_type, bool(is_output)))
        return uri

    def log_confusion_matrix(self, y_true: Sequence[Any], y_pred: Sequence[Any],
                             title: str | None = None, is_output: bool = True) -> None:
        """Record a confusion matrix (a ``ConfusionMatrix`` JSON artifact)."""
        self._log_graph(_graphs.confusion_matrix(y_true, y_pred, title), title, is_output)

    def log_precision_recall(self, y_true: Sequence[Any],
                             predicted_probabilities: Sequence[Any],
                             positive_label: Any = None, title: str | None = None,
                             is_output: bool = True, no_skill: float | None = None) -> None:
        """Record a precision-recall curve and its average precision (binary labels)."""
        data = _graphs.precision_recall(y_true, predicted_probabilities, positive_label, title,
                                        no_skill)
        self._log_graph(data, title, is_output)

    def log_roc_curve(self, y_true: Sequence[Any], y_score: Sequence[Any],
                      title: str | None = None, is_output: bool = True) -> None:
        """Record a ROC curve and its area (binary labels)."""
        self._log_graph(_graphs.roc_curve(y_true, y_score, title), title, is_output)

    def _log_graph(self, data: dict[str, Any], title: str | None, is_output: bool) -> None:
        kind = str(data["type"])
        name = title or f"{kind}-{datetime.now(UTC).strftime('%y%m%d-%H%M%S-%f')}"
        _check_artifact_name(name)
        uri = self._upload(f"{name}.json", json.dumps(data).encode())
        self._metadata().add_run_artifact(
            self.experiment_name, self.run_name,
            RunArtifact(name, uri, "application/json", bool(is_output), kind))

    def _upload(self, name: str, data: bytes) -> str:
        self._start()
        if self._artifacts is None:
            if self._artifact_bucket:
                from shoal.storage.artifacts import FsspecArtifactStore

                bucket = self._artifact_bucket
                url = bucket if "://" in bucket else f"s3://{bucket}"
                self._artifacts = FsspecArtifactStore.open(url)
            else:
                self._artifacts = self._session().artifacts
        key = "/".join(p for p in (self._artifact_prefix, self.experiment_name, self.run_name,
                                   name) if p)
        self._artifacts.put_bytes(key, data)
        return str(self._artifacts.uri(key))


def load_run(run_name: str | None = None, experiment_name: str | None = None,
             sagemaker_session: Session | None = None, artifact_bucket: str | None = None,
             artifact_prefix: str | None = None,
             tags: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None) -> Run:
    """The run to log to (SageMaker's ``load_run``); *tags* are added to it.

    - With ``experiment_name`` and ``run_name``: resumes that run (it must exist); leaving
      its ``with`` block marks it Completed or Failed again.
    - With no names, inside a job submitted from a ``with Run(...)`` block: that run.
    - With no names, inside a ``with Run(...)`` block in this process: that run.

    Runs found the last two ways are ended by the code that opened them, not here.
    """
    if run_name is not None:
        if experiment_name is None:
            raise InvalidArgumentError(f"load_run(run_name={run_name!r}) needs the experiment "
                                       "too: load_run(experiment_name=..., run_name=...)")
        run = Run(experiment_name, run_name, sagemaker_session=sagemaker_session,
                  artifact_bucket=artifact_bucket, artifact_prefix=artifact_prefix)
        run._mode = _Mode.RESUME
        store = run._metadata()
        try:
            record = store.get_run(run.experiment_name, run.run_name)
        except RunNotFound as e:
            raise RunNotFound(f"no run named {run_name!r} in experiment {experiment_name!r} to "
                              f"resume; Run(experiment_name={experiment_name!r}, run_name="
                              f"{run_name!r}) creates it", experiment=experiment_name,
                              run=run_name) from e
        if record.status.is_terminal:
            store.resume_run(run.experiment_name, run.run_name)
        run._started = True
        _context.track()
        return _tagged(run, tags)
    names = _context_names(experiment_name)
    run = Run(names[0], names[1], sagemaker_session=sagemaker_session,
              artifact_bucket=artifact_bucket, artifact_prefix=artifact_prefix)
    run._mode = _Mode.ATTACH
    open_here = _context.current_run()
    if open_here is not None and (open_here.experiment_name, open_here.run_name) == names:
        run._session_arg = sagemaker_session or open_here._session_arg
        run._started = True  # the open run exists: no read needed
        _context.track()
        return _tagged(run, tags)
    run._metadata().get_run(*names)  # a clear error if the run is gone
    run._started = True
    _context.track()
    return _tagged(run, tags)


def _tagged(run: Run, tags: Sequence[Mapping[str, str]] | Mapping[str, str] | None) -> Run:
    """SageMaker's ``load_run(tags=...)``: the loaded run gets these tags too."""
    checked = _tags(tags)
    if checked:
        run._metadata().set_run_tags(run.experiment_name, run.run_name, checked)
    return run


def _context_names(experiment_name: str | None) -> tuple[str, str]:
    from shoal.config import job_run_context

    raw = job_run_context()
    if raw:
        try:
            data = json.loads(raw)
            names = (str(data["experiment_name"]), str(data["run_name"]))
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidArgumentError(f"SHOAL_RUN_CONTEXT is not a run context ({raw!r}): "
                                       f"{e}") from e
        source = "the job's run"
    else:
        open_here = _context.current_run()
        if open_here is None:
            raise InvalidArgumentError(
                "load_run() found no run: no 'with Run(...)' block is open in this process and "
                "this is not a job submitted from one. Open a run first, or give "
                "load_run(experiment_name=..., run_name=...)")
        names = (open_here.experiment_name, open_here.run_name)
        source = "the open run"
    if experiment_name is not None and experiment_name != names[0]:
        raise InvalidArgumentError(f"load_run(experiment_name={experiment_name!r}) without "
                                   f"run_name, but {source} belongs to experiment "
                                   f"{names[0]!r}; give run_name too")
    return names


def _new_run_name() -> str:
    import secrets

    return f"run-{datetime.now(UTC).strftime('%y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _tags(tags: Sequence[Mapping[str, str]] | Mapping[str, str] | None) -> dict[str, str]:
    if not tags:
        return {}
    if isinstance(tags, Mapping):
        return {str(k): str(v) for k, v in tags.items()}
    out = {}
    for t in tags:
        if not isinstance(t, Mapping) or "Key" not in t or "Value" not in t:
            raise InvalidArgumentError(f'tag {t!r} must be {{"Key": ..., "Value": ...}}')
        out[str(t["Key"])] = str(t["Value"])
    return out


def _check_step(name: str, step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise InvalidArgumentError(f"metric {name!r}: step must be an integer, got {step!r}",
                                   metric=name)
    return int(step)


def _epoch(name: str, timestamp: Any) -> float:
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:  # SageMaker reads naive datetimes as UTC
            timestamp = timestamp.replace(tzinfo=UTC)
        return float(timestamp.timestamp())
    try:
        return check_metric_value(name, timestamp)
    except InvalidArgumentError:
        raise InvalidArgumentError(f"metric {name!r}: timestamp must be a datetime or epoch "
                                   f"seconds, got {timestamp!r}", metric=name) from None


def _check_artifact_name(name: Any) -> None:
    if not isinstance(name, str) or not name.strip() or "/" in name or "\\" in name \
            or name in (".", "..") or len(name) > 255:
        raise InvalidArgumentError(f"artifact name {name!r} must be a non-empty file name "
                                   "(no '/'), at most 255 characters", name=repr(name))
