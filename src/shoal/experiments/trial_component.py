"""At SageMaker's path ``sagemaker.experiments.trial_component``: a run seen as a trial component.

SageMaker records each ``Run`` as a trial component named ``<experiment>-<run>``; code reads
them back with ``_TrialComponent.load`` and ``_TrialComponent.list``. Here they read shoal's
run records (the same names ``ExperimentAnalytics`` shows). Creating or deleting trial
components directly is not provided: runs are made with ``Run(...)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from shoal.errors import InvalidArgumentError, NotFoundError

if TYPE_CHECKING:
    from shoal.core.experiments import RunRecord
    from shoal.core.ports import RunStore
    from shoal.session import Session

__all__ = ["TrialComponent", "TrialComponentSummary", "_TrialComponent"]


@dataclass(frozen=True, slots=True)
class TrialComponentSummary:
    """One entry of ``_TrialComponent.list`` (SageMaker's ``TrialComponentSummary`` fields)."""

    trial_component_name: str
    display_name: str | None
    status: dict[str, str]
    creation_time: datetime
    end_time: datetime | None


@dataclass(slots=True)
class _TrialComponent:
    """A run as SageMaker's trial component: name, display name, status, times, parameters,
    output artifacts and metric summaries."""

    trial_component_name: str
    display_name: str | None = None
    status: dict[str, str] = field(default_factory=dict)
    creation_time: datetime | None = None
    end_time: datetime | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    input_artifacts: dict[str, Any] = field(default_factory=dict)
    output_artifacts: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    tags: list[dict[str, str]] = field(default_factory=list)
    experiment_name: str = ""
    run_name: str = ""

    @classmethod
    def load(cls, trial_component_name: str, sagemaker_session: Session | None = None
             ) -> _TrialComponent:
        """The run whose trial-component name (``<experiment>-<run>``) is given."""
        store = _store(sagemaker_session)
        for exp in store.list_experiments():
            prefix = f"{exp.name}-"
            if trial_component_name.startswith(prefix):
                run = store.find_run(exp.name, trial_component_name[len(prefix):])
                if run is not None:
                    return cls._from_run(run, store)
        raise NotFoundError(f"no trial component {trial_component_name!r}: no experiment run "
                            "is named <experiment>-<run> that way; list them with "
                            "_TrialComponent.list(experiment_name=...)",
                            trial_component=trial_component_name)

    @classmethod
    def list(cls, source_arn: str | None = None, created_before: datetime | None = None,
             created_after: datetime | None = None, sort_by: str | None = None,
             sort_order: str | None = None, sagemaker_session: Session | None = None,
             trial_name: str | None = None, experiment_name: str | None = None,
             max_results: int | None = None, next_token: str | None = None
             ) -> Iterator[TrialComponentSummary]:
        """Summaries of the runs (of *experiment_name*, else of every experiment)."""
        store = _store(sagemaker_session)
        names = [experiment_name] if experiment_name else [e.name for e in
                                                           store.list_experiments()]
        runs = [r for name in names for r in store.list_runs(name)
                if (created_before is None or r.created_at < created_before)
                and (created_after is None or r.created_at > created_after)]
        runs.sort(key=lambda r: r.created_at if sort_by != "Name" else
                  f"{r.experiment_name}-{r.run_name}", reverse=sort_order == "Descending")
        for run in runs[:max_results]:
            yield TrialComponentSummary(f"{run.experiment_name}-{run.run_name}",
                                        run.display_name, {"PrimaryStatus": str(run.status)},
                                        run.created_at, run.ended_at)

    @classmethod
    def create(cls, trial_component_name: str, display_name: str | None = None,
               tags: Any = None, sagemaker_session: Session | None = None) -> _TrialComponent:
        raise InvalidArgumentError("trial components are not created directly here; open a "
                                   "run with shoal.experiments.Run(experiment_name=..., "
                                   "run_name=...), which is one")

    def delete(self, force_disassociate: bool = False) -> None:
        raise InvalidArgumentError(f"deleting trial component {self.trial_component_name!r} "
                                   "is not provided: shoal keeps every run's record")

    @classmethod
    def _from_run(cls, run: RunRecord, store: RunStore) -> _TrialComponent:
        summaries = store.metric_summaries(run.metrics_owner)
        return cls(
            trial_component_name=f"{run.experiment_name}-{run.run_name}",
            display_name=run.display_name, status={"PrimaryStatus": str(run.status)},
            creation_time=run.created_at, end_time=run.ended_at,
            parameters=dict(run.parameters),
            output_artifacts={a.name: {"Value": a.value, "MediaType": a.media_type}
                              for a in run.artifacts if a.is_output},
            input_artifacts={a.name: {"Value": a.value, "MediaType": a.media_type}
                             for a in run.artifacts if not a.is_output},
            metrics=[{"MetricName": s.name, "Min": s.min, "Max": s.max, "Avg": s.avg,
                      "Last": s.last, "Count": s.count} for s in summaries],
            tags=[{"Key": k, "Value": v} for k, v in run.tags.items()],
            experiment_name=run.experiment_name, run_name=run.run_name)


TrialComponent = _TrialComponent


def _store(session: object) -> RunStore:
    from shoal.session import Session, current

    return (session if isinstance(session, Session) else current()).runs
