"""Run and load_run against the session's real SQLite and file stores, and from real jobs."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

import shoal
from shoal import RemoteExecutor, remote
from shoal.analytics import ExperimentAnalytics
from shoal.core import JobQuery, MetricPoint, RunStatus
from shoal.core.jobs import RunRef
from shoal.errors import AlreadyExistsError, InvalidArgumentError, RunNotFound
from shoal.experiments import Run, current_run_context, load_run
from shoal.storage.sql import upgrade_schema


def _metrics(session: shoal.Session, experiment: str, run: str,
             name: str | None = None) -> list[MetricPoint]:
    return session.metadata.get_metrics(session.metadata.get_run(experiment, run).metrics_owner, name)


def _artifact_json(uri: str) -> dict:
    assert uri.startswith("file://")
    return json.loads(Path(uri.removeprefix("file://")).read_text())


# --- a run in this process ----------------------------------------------------------------

def test_a_run_records_parameters_metrics_and_artifacts(session, tmp_path):
    report = tmp_path / "report.csv"
    report.write_text("a,b\n1,2\n")
    with Run(experiment_name="mnist", run_name="baseline", experiment_display_name="MNIST",
             run_display_name="Baseline", tags=[{"Key": "team", "Value": "ml"}]) as run:
        assert (run.experiment_name, run.run_name) == ("mnist", "baseline")
        assert session.metadata.get_run("mnist", "baseline").status is RunStatus.IN_PROGRESS
        run.log_parameter("lr", 0.1)
        run.log_parameters({"optimizer": "adam", "epochs": np.int64(3), "amp": True})
        for step in range(5):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
        run.log_metric("acc", np.float32(0.5), timestamp=datetime(2025, 1, 1, tzinfo=UTC))
        run.log_confusion_matrix([0, 1, 1, 2, 2, 2], [0, 1, 2, 2, 2, 1], title="confusion")
        run.log_precision_recall([0, 1, 1, 0], [0.1, 0.8, 0.35, 0.4], title="pr")
        run.log_roc_curve([0, 1, 1, 0], [0.1, 0.8, 0.35, 0.4], title="roc")
        run.log_artifact("dataset", "s3://bucket/train.csv", media_type="text/csv",
                         is_output=False)
        uri = run.log_file(report)
    record = session.metadata.get_run("mnist", "baseline")
    assert record.status is RunStatus.COMPLETED and record.ended_at is not None
    assert record.display_name == "Baseline" and dict(record.tags) == {"team": "ml"}
    assert session.metadata.get_experiment("mnist").display_name == "MNIST"
    assert record.parameters == {"lr": 0.1, "optimizer": "adam", "epochs": 3, "amp": True}
    assert [(p.step, p.value) for p in _metrics(session, "mnist", "baseline", "loss")] == [
        (i, 1.0 / (i + 1)) for i in range(5)]
    [acc] = _metrics(session, "mnist", "baseline", "acc")
    assert acc.value == 0.5 and acc.timestamp == datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    artifacts = {a.name: a for a in record.artifacts}
    assert set(artifacts) == {"confusion", "pr", "roc", "dataset", "report.csv"}
    assert artifacts["dataset"].is_output is False
    assert artifacts["report.csv"].value == uri and artifacts["report.csv"].media_type == "text/csv"
    assert uri.endswith("/experiments/mnist/baseline/report.csv")
    assert Path(uri.removeprefix("file://")).read_text() == "a,b\n1,2\n"
    cm = _artifact_json(artifacts["confusion"].value)
    assert artifacts["confusion"].artifact_type == "ConfusionMatrix"
    assert cm == {"type": "ConfusionMatrix", "version": 0, "title": "confusion",
                  "confusionMatrix": [[1, 0, 0], [0, 1, 1], [0, 1, 2]]}
    pr = _artifact_json(artifacts["pr"].value)
    assert pr["type"] == "PrecisionRecallCurve" and pr["precision"][-1] == 1.0
    assert pr["averagePrecisionScore"] == pytest.approx(0.8333333333)
    roc = _artifact_json(artifacts["roc"].value)
    assert roc["type"] == "ROCCurve" and roc["areaUnderCurve"] == pytest.approx(0.75)


def test_ten_thousand_metrics_are_all_stored_in_order(session):
    # How fast: bench/metrics.py (a timed assertion here failed on a busy machine).
    with Run(experiment_name="speed", run_name="r") as run:
        run.log_metric("warm-up", 0.0)
        run.flush()  # the store's connection is open, as it is after a run's first batch
        for i in range(10_000):
            run.log_metric("loss", 1.0 / (i + 1), step=i)
    points = _metrics(session, "speed", "r", "loss")
    assert [(p.step, p.value) for p in points] == [(i, 1.0 / (i + 1)) for i in range(10_000)]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), "abc", True,
                                   None, [1.0]])
def test_bad_metric_values_raise_at_once_and_store_nothing(session, value):
    run = Run(experiment_name="bad-values", run_name="r")
    with pytest.raises(InvalidArgumentError) as info:
        run.log_metric("loss", value)
    assert "'loss'" in str(info.value)
    assert session.metadata.find_experiment("bad-values") is None  # not even the run
    with run:
        run.log_metric("loss", 1.0)
        with pytest.raises(InvalidArgumentError, match="'loss'"):
            run.log_metric("loss", value, step=2)
        run.log_metric("loss", 2.0)
    assert [p.value for p in _metrics(session, "bad-values", "r")] == [1.0, 2.0]


def test_bad_steps_timestamps_names_and_parameters(session):
    with Run(experiment_name="bad-args", run_name="r") as run:
        for kwargs in ({"step": 1.5}, {"step": True}, {"timestamp": "yesterday"},
                       {"timestamp": float("nan")}):
            with pytest.raises(InvalidArgumentError, match="'m'"):
                run.log_metric("m", 1.0, **kwargs)
        with pytest.raises(InvalidArgumentError, match="metric name"):
            run.log_metric("", 1.0)
        with pytest.raises(InvalidArgumentError, match="'p'"):
            run.log_parameter("p", [1, 2])
        with pytest.raises(InvalidArgumentError, match="'q'"):
            run.log_parameters({"ok": 1, "q": float("nan")})  # all or nothing
    record = session.metadata.get_run("bad-args", "r")
    assert record.parameters == {} and _metrics(session, "bad-args", "r") == []
    with pytest.raises(InvalidArgumentError, match="run_name"):
        Run(experiment_name="bad-args", run_name="has spaces")
    with pytest.raises(InvalidArgumentError, match="experiment_name"):
        Run(experiment_name="-bad")


def test_duplicate_run_name_says_how_to_resume(session):
    with Run(experiment_name="dup", run_name="r1") as run:
        run.log_metric("m", 1.0)
    with pytest.raises(AlreadyExistsError) as info:
        with Run(experiment_name="dup", run_name="r1"):
            pytest.fail("the block must not run")
    message = str(info.value)
    assert "'dup'" in message and "'r1'" in message
    assert "load_run(experiment_name='dup', run_name='r1')" in message
    assert session.metadata.get_run("dup", "r1").status is RunStatus.COMPLETED


def test_load_run_resumes_a_run_and_ends_it_again(session):
    with Run(experiment_name="resume", run_name="r1") as run:
        run.log_metric("loss", 3.0, step=0)
    with load_run(experiment_name="resume", run_name="r1") as run:
        assert session.metadata.get_run("resume", "r1").status is RunStatus.IN_PROGRESS
        run.log_metric("loss", 2.0, step=1)
        run.log_parameter("resumed", True)
    record = session.metadata.get_run("resume", "r1")
    assert record.status is RunStatus.COMPLETED and record.parameters == {"resumed": True}
    assert [p.value for p in _metrics(session, "resume", "r1")] == [3.0, 2.0]


def test_load_run_errors_are_clear(session):
    with pytest.raises(InvalidArgumentError, match="no 'with Run"):
        load_run()
    with pytest.raises(RunNotFound) as info:
        load_run(experiment_name="nothing", run_name="ghost")
    assert "'ghost'" in str(info.value) and "'nothing'" in str(info.value)
    with pytest.raises(InvalidArgumentError, match="experiment"):
        load_run(run_name="ghost")


def test_load_run_inside_a_block_is_that_run(session):
    assert current_run_context() is None
    with Run(experiment_name="nested", run_name="outer") as run:
        assert current_run_context() == {"experiment_name": "nested", "run_name": "outer"}
        with load_run() as same:
            assert (same.experiment_name, same.run_name) == ("nested", "outer")
            same.log_metric("inner", 1.0)
        # Leaving the inner block does not end the run: its opener does.
        assert session.metadata.get_run("nested", "outer").status is RunStatus.IN_PROGRESS
        run.log_metric("outer", 2.0)
    assert current_run_context() is None
    assert session.metadata.metric_names(
        session.metadata.get_run("nested", "outer").metrics_owner) == ["inner", "outer"]


def test_failure_and_interrupt_end_the_run_accordingly(session):
    with pytest.raises(ZeroDivisionError):
        with Run(experiment_name="ends", run_name="failed") as run:
            run.log_metric("m", 1.0)
            1 / 0  # noqa: B018
    with pytest.raises(KeyboardInterrupt):
        with Run(experiment_name="ends", run_name="stopped"):
            raise KeyboardInterrupt
    run = Run(experiment_name="ends", run_name="closed")
    run.log_metric("m", 1.0)
    run.close()  # used without 'with'
    statuses = {r.run_name: r.status for r in session.metadata.list_runs("ends")}
    assert statuses == {"failed": RunStatus.FAILED, "stopped": RunStatus.STOPPED,
                        "closed": RunStatus.COMPLETED}
    assert [p.value for p in _metrics(session, "ends", "failed")] == [1.0]


def test_generated_run_names_are_unique_and_valid(session):
    names = set()
    for _ in range(3):
        with Run(experiment_name="generated") as run:
            names.add(run.run_name)
    assert len(names) == 3 and all(n.startswith("run-") for n in names)


def test_log_file_errors_and_artifact_location(session, tmp_path):
    with Run(experiment_name="files", run_name="r", artifact_bucket=f"file://{tmp_path}/bucket",
             artifact_prefix="exp-artifacts") as run:
        with pytest.raises(InvalidArgumentError) as info:
            run.log_file(tmp_path / "missing.txt")
        assert "missing.txt" in str(info.value)
        f = tmp_path / "model.bin"
        f.write_bytes(b"\x00\x01")
        uri = run.log_file(f, name="weights")
        with pytest.raises(InvalidArgumentError, match="artifact name"):
            run.log_artifact("a/b", "x")
    assert uri == f"file://{tmp_path}/bucket/exp-artifacts/files/r/weights"
    assert (tmp_path / "bucket/exp-artifacts/files/r/weights").read_bytes() == b"\x00\x01"


# --- runs and jobs ------------------------------------------------------------------------

def _train_in_job(steps: int) -> tuple[str, str]:
    from shoal.experiments import load_run

    with load_run() as run:
        for step in range(steps):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
        run.log_parameter("steps", steps)
        return run.experiment_name, run.run_name


def _log_without_closing(steps: int) -> str:
    from shoal.experiments import load_run

    run = load_run()  # no 'with' and no close(): the job's end writes the last batch
    for step in range(steps):
        run.log_metric("acc", step / steps, step=step)
    return run.run_name


def test_load_run_in_a_remote_job_is_the_callers_run(session):
    with Run(experiment_name="remote-exp", run_name="r1"):
        assert remote(_train_in_job)(1500) == ("remote-exp", "r1")
        assert remote(_log_without_closing)(1234) == "r1"
    record = session.metadata.get_run("remote-exp", "r1")
    assert record.status is RunStatus.COMPLETED and record.parameters == {"steps": 1500}
    assert [p.step for p in _metrics(session, "remote-exp", "r1", "loss")] == list(range(1500))
    assert len(_metrics(session, "remote-exp", "r1", "acc")) == 1234
    jobs = session.metadata.list_jobs(JobQuery(limit=10))
    assert sorted(record.jobs) == sorted(j.name for j in jobs)
    assert all(j.spec.run == RunRef("remote-exp", "r1")
               for j in jobs)
    assert [r.run_name for r in session.metadata.runs_for_job(jobs[0].name)] == ["r1"]


def test_executor_jobs_are_linked_and_jobs_outside_a_run_are_not(session):
    with Run(experiment_name="remote-exp", run_name="many"), \
            RemoteExecutor(max_parallel_jobs=2) as executor:
        results = [f.result() for f in [executor.submit(_train_in_job, 3) for _ in range(2)]]
    assert results == [("remote-exp", "many")] * 2
    assert len(session.metadata.get_run("remote-exp", "many").jobs) == 2
    assert len(_metrics(session, "remote-exp", "many", "loss")) == 6

    outside = remote(_job_name)()
    assert session.metadata.get_job(outside).spec.run is None
    assert session.metadata.runs_for_job(outside) == []
    with pytest.raises(InvalidArgumentError, match="no 'with Run"):
        remote(_train_in_job)(1)


@pytest.mark.parametrize("how", ["exec", "warm"])
def test_the_last_batch_is_written_in_fresh_interpreters_and_warm_workers(tmp_path, how):
    """A job run as 'python -m shoal.jobs._entrypoint' (its hooks live in __main__), or by a
    warm worker that outlives the job: both write what load_run() buffered."""
    from conftest import make_session

    s = make_session(tmp_path / how, job_process="exec" if how == "exec" else "fork")
    options = {"keep_alive_period_in_seconds": 30} if how == "warm" else {}
    try:
        with shoal.use(s):
            for i in range(2):
                with Run(experiment_name=how, run_name=f"r{i}"):
                    assert remote(**options)(_log_without_closing)(1001 + i) == f"r{i}"
                assert len(_metrics(s, how, f"r{i}", "acc")) == 1001 + i
    finally:
        s.backend.shutdown_launcher()
        s.close()


def _job_name() -> str:
    import os

    return os.environ["SHOAL_JOB_NAME"]


# --- analytics ----------------------------------------------------------------------------

def test_experiment_analytics_dataframe(session):
    for name, lr, losses in (("a", 0.1, [3.0, 2.0, 1.0]), ("b", 0.01, [2.0, 0.5]),
                             ("c", 1.0, [])):
        with Run(experiment_name="analytics", run_name=name) as run:
            run.log_parameters({"lr": lr, "opt": "sgd"})
            for step, loss in enumerate(losses):
                run.log_metric("loss", loss, step=step)
            run.log_metric("acc", lr)
    df = ExperimentAnalytics(experiment_name="analytics").dataframe()
    assert list(df["RunName"]) == ["a", "b", "c"]
    assert list(df.columns[:8]) == ["TrialComponentName", "DisplayName", "RunName",
                                    "ExperimentName", "Status", "CreationTime", "EndTime", "Jobs"]
    assert list(df["TrialComponentName"]) == ["analytics-a", "analytics-b", "analytics-c"]
    assert set(df["Status"]) == {"Completed"} and list(df["lr"]) == [0.1, 0.01, 1.0]
    a = df.iloc[0]
    assert (a["loss - Min"], a["loss - Max"], a["loss - Avg"], a["loss - Last"],
            a["loss - Count"]) == (1.0, 3.0, 2.0, 1.0, 3)
    assert np.isnan(df.iloc[2]["loss - Min"])  # run c logged no loss

    by_loss = ExperimentAnalytics(experiment_name="analytics", sort_by="metrics.loss.min",
                                  sort_order="Ascending", metric_names=["loss"],
                                  parameter_names=["lr"]).dataframe()
    assert list(by_loss["RunName"]) == ["b", "a", "c"]  # no value sorts last
    assert "opt" not in by_loss.columns and "acc - Last" not in by_loss.columns
    by_lr = ExperimentAnalytics(experiment_name="analytics", sort_by="Parameters.lr")
    assert list(by_lr.dataframe()["RunName"]) == ["c", "a", "b"]  # Descending by default
    with pytest.raises(InvalidArgumentError, match="cannot sort by"):
        ExperimentAnalytics(experiment_name="analytics", sort_by="metrics.nope.max").dataframe()


# --- PostgreSQL ---------------------------------------------------------------------------

@pytest.mark.postgres
def test_a_run_on_postgres(tmp_path, postgres_url):
    upgrade_schema(postgres_url)
    s = shoal.Session(home=str(tmp_path / "pg-home"), metadata_url=postgres_url)
    try:
        with shoal.use(s), Run(experiment_name=f"pg-{uuid.uuid4().hex[:8]}",
                               run_name="r") as run:
            for i in range(2000):
                run.log_metric("loss", float(i), step=i)
            run.log_parameter("lr", 0.5)
        record = s.metadata.get_run(run.experiment_name, "r")
        assert record.status is RunStatus.COMPLETED and record.parameters == {"lr": 0.5}
        assert [p.step for p in s.metadata.get_metrics(record.metrics_owner)] == list(range(2000))
    finally:
        s.close()
