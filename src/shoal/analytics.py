"""``ExperimentAnalytics``: an experiment's runs as a pandas DataFrame, one row per run, in
the columns SageMaker's ``sagemaker.analytics.ExperimentAnalytics`` uses.

Example:
    >>> from shoal.analytics import ExperimentAnalytics      # doctest: +SKIP
    >>> df = ExperimentAnalytics(experiment_name="mnist", sort_by="metrics.loss.min",
    ...                          sort_order="Ascending").dataframe()
    >>> df[["RunName", "lr", "loss - Min", "loss - Last"]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shoal.errors import InvalidArgumentError

if TYPE_CHECKING:
    import pandas as pd

    from shoal.core.ports import RunStore
    from shoal.session import Session

__all__ = ["ExperimentAnalytics"]

_STATS = (("Min", "min"), ("Max", "max"), ("Avg", "avg"), ("Last", "last"), ("Count", "count"))
_BASE = ("TrialComponentName", "DisplayName", "RunName", "ExperimentName", "Status",
         "CreationTime", "EndTime", "Jobs")
_ORDERS = {"ascending": True, "descending": False}


class ExperimentAnalytics:
    """The runs of one experiment as a table (SageMaker's class and arguments).

    Columns: ``TrialComponentName`` (``<experiment>-<run>``, as on SageMaker), ``DisplayName``,
    ``RunName``, ``ExperimentName``, ``Status``, ``CreationTime``, ``EndTime``, ``Jobs``; one
    column per parameter; ``<metric> - Min|Max|Avg|Last|Count`` per metric; and
    ``<artifact> - Value|MediaType`` per artifact.

    Args:
        sort_by: ``CreationTime``, ``Name``, ``Parameters.<name>``, ``Metrics.<name>.<Stat>``
            (case-insensitive, SageMaker's search names) or a column of the frame.
        sort_order: ``Ascending`` or ``Descending`` (the default when sorting).
        metric_names / parameter_names: keep only these metrics / parameters.
    """

    def __init__(self, experiment_name: str | None = None, search_expression: Any = None,
                 sort_by: str | None = None, sort_order: str | None = None,
                 metric_names: Sequence[str] | None = None,
                 parameter_names: Sequence[str] | None = None,
                 sagemaker_session: Session | None = None,
                 input_artifact_names: Sequence[str] | None = None,
                 output_artifact_names: Sequence[str] | None = None) -> None:
        if not experiment_name:
            raise InvalidArgumentError("ExperimentAnalytics needs experiment_name=...")
        if search_expression is not None:
            raise InvalidArgumentError("search_expression is not supported by shoal yet; give "
                                       "experiment_name and filter the DataFrame instead")
        if sort_order is not None and str(sort_order).lower() not in _ORDERS:
            raise InvalidArgumentError(f"sort_order must be 'Ascending' or 'Descending', got "
                                       f"{sort_order!r}")
        self._experiment = experiment_name
        self._sort_by = sort_by
        self._ascending = _ORDERS[str(sort_order or "Descending").lower()]
        self._metric_names = None if metric_names is None else set(metric_names)
        self._parameter_names = None if parameter_names is None else set(parameter_names)
        self._inputs = None if input_artifact_names is None else set(input_artifact_names)
        self._outputs = None if output_artifact_names is None else set(output_artifact_names)
        self._session = sagemaker_session
        self._frame: pd.DataFrame | None = None

    @property
    def name(self) -> str:
        return self._experiment

    def clear_cache(self) -> None:
        self._frame = None

    def dataframe(self, force_refresh: bool = False) -> pd.DataFrame:
        """The table (read once, then cached; ``force_refresh=True`` reads again)."""
        if force_refresh or self._frame is None:
            self._frame = self._fetch()
        return self._frame

    def _store(self) -> RunStore:
        from shoal.session import Session, current

        session = self._session if isinstance(self._session, Session) else current()
        return session.runs

    def _fetch(self) -> pd.DataFrame:
        from shoal._internal.extras import require

        require("experiments", "ExperimentAnalytics", "pandas")
        import pandas as pd

        store = self._store()
        rows = [self._row(run, store.metric_summaries(run.metrics_owner))
                for run in store.list_runs(self._experiment)]
        columns = list(_BASE)
        for row in rows:
            columns += [c for c in row if c not in columns]
        frame = pd.DataFrame(rows, columns=columns)
        if self._sort_by:
            column = _sort_column(self._sort_by, columns)
            frame = frame.sort_values(column, ascending=self._ascending, kind="stable",
                                      na_position="last").reset_index(drop=True)
        return frame

    def _row(self, run: Any, summaries: Sequence[Any]) -> dict[str, Any]:
        row: dict[str, Any] = {
            "TrialComponentName": f"{run.experiment_name}-{run.run_name}",
            "DisplayName": run.display_name or run.run_name,
            "RunName": run.run_name,
            "ExperimentName": run.experiment_name,
            "Status": str(run.status),
            "CreationTime": run.created_at,
            "EndTime": run.ended_at,
            "Jobs": ", ".join(run.jobs),
        }
        for name, value in run.parameters.items():
            if self._parameter_names is None or name in self._parameter_names:
                row[name] = value
        for s in summaries:
            if self._metric_names is None or s.name in self._metric_names:
                for label, attr in _STATS:
                    row[f"{s.name} - {label}"] = getattr(s, attr)
        for a in run.artifacts:
            wanted = self._outputs if a.is_output else self._inputs
            if wanted is None or a.name in wanted:
                row[f"{a.name} - Value"] = a.value
                row[f"{a.name} - MediaType"] = a.media_type
        return row


def _sort_column(sort_by: str, columns: list[str]) -> str:
    if sort_by in columns:
        return sort_by
    parts = sort_by.split(".")
    head = parts[0].lower()
    if head == "creationtime" and len(parts) == 1:
        return "CreationTime"
    if head == "name" and len(parts) == 1:
        return "RunName"
    if head == "parameters" and len(parts) >= 2:
        wanted = ".".join(parts[1:])
        if wanted in columns:
            return wanted
    if head == "metrics" and len(parts) >= 3:
        stat = {label.lower(): label for label, _ in _STATS}.get(parts[-1].lower())
        column = f"{'.'.join(parts[1:-1])} - {stat}"
        if stat and column in columns:
            return column
    raise InvalidArgumentError(
        f"cannot sort by {sort_by!r}: use CreationTime, Name, Parameters.<name>, "
        "Metrics.<name>.<Min|Max|Avg|Last|Count> or one of the columns "
        f"({', '.join(columns)})", sort_by=sort_by)
