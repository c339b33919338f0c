"""A job's own experiment run through the team server, and job tokens once their job ended.

A job's token reaches the run its job was submitted for, as the server's record of the job
says (``JobSpec.run``: the client's open ``with Run(...)`` or ``experiment_config``): its
record, metrics, parameters, tags and logged files; no other run. After the job has ended
its token writes nothing. All through a real ``shoal server`` process, real jobs on its
backend and real tokens (``team``: a client of user alice)."""

from __future__ import annotations

import uuid

import pytest

from shoal.client import HttpArtifactStore, HttpJobStore, HttpRunStore
from shoal.core import JobName, JobQuery, JobSpec, JobStatus, MetricPoint, job_owner, run_owner
from shoal.errors import PermissionDeniedError
from shoal.server._jobtokens import JobTokens


def _tag() -> str:
    return uuid.uuid4().hex[:6]


def test_load_run_inside_remote_logs_to_the_callers_run_through_the_server(team, tmp_path):
    from shoal import remote
    from shoal.experiments import Run

    exp = f"jobrun-{_tag()}"

    @remote
    def train(lr):
        import pathlib
        import tempfile

        from shoal.experiments import load_run

        with load_run() as run:  # the caller's run, found from the job's own record
            run.log_parameter("lr", lr)
            for step, loss in enumerate((0.9, 0.5, 0.25), start=1):
                run.log_metric("loss", loss, step=step)
            run.log_artifact("notes", "trained on the server")
            with tempfile.TemporaryDirectory() as tmp:
                path = pathlib.Path(tmp) / "weights.txt"
                path.write_text("w=1")
                uri = run.log_file(path)
        with load_run(tags={"stage": "trained"}):
            pass
        return run.experiment_name, run.run_name, uri

    with Run(experiment_name=exp, run_name="r1"):
        got = train(0.1)
    assert got[:2] == (exp, "r1")
    record = team.runs.get_run(exp, "r1")
    assert record.status.value == "Completed"  # ended by the client's with, not the job
    assert dict(record.parameters) == {"lr": 0.1}
    assert dict(record.tags).get("stage") == "trained"
    points = team.runs.get_metrics(run_owner(exp, "r1"), "loss")
    assert [(p.step, p.value) for p in points] == [(1, 0.9), (2, 0.5), (3, 0.25)]
    artifacts = {a.name: a.value for a in record.artifacts}
    assert artifacts["notes"] == "trained on the server"
    assert artifacts["weights.txt"] == got[2]
    key = f"experiments/{exp}/r1/weights.txt"
    assert team.artifacts.get_bytes(key) == b"w=1"  # in the server's store
    [job] = record.jobs  # the job that logged it, linked by the client
    assert job.startswith("train-") and team.jobs.get(job).status == JobStatus.COMPLETED


def test_a_job_token_writing_another_run_is_refused_naming_the_job_and_the_run(team):
    from shoal import remote
    from shoal.experiments import Run

    exp = f"jobrun-deny-{_tag()}"
    with Run(experiment_name=exp, run_name="other"):
        pass  # alice's own run, but not the one the job was submitted for

    @remote
    def reach_other_run(exp):
        import os

        import httpx

        headers = {"Authorization": f"Bearer {os.environ['SHOAL_TOKEN']}"}
        url = os.environ["SHOAL_SERVER_URL"] + "/api/v1"
        with httpx.Client(base_url=url, headers=headers) as http:
            answers = {
                "metrics": http.post("/metrics", params={"owner": f"run:{exp}/other"},
                                     json={"points": [["loss", 1.0, 1.0, None]]}),
                "tags": http.post(f"/experiments/{exp}/runs/other/tags",
                                  json={"tags": {"k": "v"}}),
                "read": http.get(f"/experiments/{exp}/runs/other"),
                "file": http.put("/artifacts", params={"key": f"experiments/{exp}/other/x"},
                                 content=b"x"),
                "create": http.post(f"/experiments/{exp}/runs", json={"run_name": "new"}),
                "own": http.get(f"/experiments/{exp}/runs/mine"),
            }
        return {k: (r.status_code, r.json()["error"]["message"] if r.status_code >= 400
                    else "") for k, r in answers.items()}

    with Run(experiment_name=exp, run_name="mine"):
        answers = reach_other_run(exp)
    [job] = team.jobs.metadata.list_jobs(JobQuery(name_prefix="reach-other-run-"))
    assert answers.pop("own")[0] == 200  # its own run it reads
    assert {k: status for k, (status, _) in answers.items()} == dict.fromkeys(answers, 403)
    for what, (_, message) in answers.items():
        assert f"job {job.name}" in message, (what, message)
        assert f"{exp}/mine" in message or what == "create", (what, message)
    assert f"run 'other' of experiment '{exp}'" in answers["tags"][1]
    assert f"'run:{exp}/other'" in answers["metrics"][1]
    other = team.runs.get_run(exp, "other")
    assert dict(other.tags) == {} and team.runs.get_metrics(run_owner(exp, "other")) == []
    assert not team.artifacts.exists(f"experiments/{exp}/other/x")
    assert {r.run_name for r in team.runs.list_runs(exp)} == {"mine", "other"}  # no "new"


def test_a_job_submitted_without_a_run_reaches_none(team):
    from shoal import remote

    @remote
    def runless():
        import os

        import httpx

        headers = {"Authorization": f"Bearer {os.environ['SHOAL_TOKEN']}"}
        url = os.environ["SHOAL_SERVER_URL"] + "/api/v1"
        got = httpx.get(f"{url}/experiments/any/runs/any", headers=headers)
        return got.status_code, got.json()["error"]["message"]

    status, message = runless()
    assert status == 403 and "submitted for no run" in message, message


def test_estimator_fit_with_experiment_config_reports_to_its_run(team, tmp_path):
    from shoal.estimator import Estimator
    from shoal.experiments import Run

    exp = f"jobrun-fit-{_tag()}"
    with Run(experiment_name=exp, run_name="fit-1"):
        pass
    script = tmp_path / "train.py"
    script.write_text(
        "from shoal.experiments import load_run\n"
        "for step, loss in enumerate((0.8, 0.4), start=1):\n"
        "    print(f'epoch {step} loss={loss} ', flush=True)\n"
        "with load_run() as run:\n"
        "    run.log_metric('accuracy', 0.75, step=2)\n"
        "    run.log_parameter('epochs', 2)\n")
    est = Estimator(entry_point=str(script), sagemaker_session=team,
                    metric_definitions=[{"Name": "train:loss", "Regex": r"loss=([0-9.]+) "}])
    est.fit(logs=False, experiment_config={"ExperimentName": exp, "RunName": "fit-1"})
    job = est.latest_training_job.name
    assert team.jobs.get(job).status == JobStatus.COMPLETED, team.jobs.read_log(job)
    run = team.runs.get_run(exp, "fit-1")
    assert job in run.jobs and dict(run.parameters) == {"epochs": 2}
    series = {(p.name, p.value) for p in team.runs.get_metrics(run_owner(exp, "fit-1"))}
    # the job's metric definitions (written by its supervisor) and its own load_run()
    assert {("train:loss", 0.8), ("train:loss", 0.4), ("accuracy", 0.75)} <= series


# --- job tokens after their job ended -----------------------------------------------------

def test_a_jobs_token_writes_nothing_once_the_job_has_ended(team, shoal_server):
    from shoal import remote

    @remote
    def leak_token():
        import os

        return os.environ["SHOAL_TOKEN"]

    token = leak_token()
    [job] = team.jobs.metadata.list_jobs(JobQuery(name_prefix="leak-token-"))
    assert job.status == JobStatus.COMPLETED
    url = shoal_server.url
    with HttpJobStore.open(url, token) as jobs, HttpArtifactStore.open(url, token) as files, \
            HttpRunStore.open(url, token) as runs:
        assert jobs.get_job(job.name).status == JobStatus.COMPLETED  # it still reads
        assert jobs.get_job_key_salt(job.name) == team.jobs.metadata.get_job_key_salt(job.name)
        attempts = {
            "artifact": lambda: files.put_bytes(f"{job.name}/output/forged", b"forged"),
            "record": lambda: jobs.update_job(job.name, status=JobStatus.FAILED,
                                              reason="forged"),
            "metrics": lambda: runs.add_metrics(job_owner(job.name),
                                                [MetricPoint("loss", 1.0, 1.0)]),
        }
        for what, attempt in attempts.items():
            with pytest.raises(PermissionDeniedError) as info:
                attempt()
            message = info.value.message
            assert f"job {job.name} has ended (completed)" in message, (what, message)
            assert "writes nothing once its job has ended" in message, (what, message)
    assert not team.artifacts.exists(f"{job.name}/output/forged")
    assert team.jobs.get(job.name).status == JobStatus.COMPLETED
    assert team.runs.get_metrics(job_owner(job.name)) == []


def test_a_job_token_of_a_job_another_user_owns_or_that_is_gone_writes_nothing(shoal_server,
                                                                                team):
    tokens = JobTokens(shoal_server.home / "server" / "job-token-secret")
    name, gone = f"owned-{_tag()}", f"gone-{_tag()}"
    team.jobs.metadata.create_job(JobSpec(name=JobName(name), function_name="operator.add"),
                                  key_salt="00" * 16, backend="local")  # alice's, pending
    cases = {  # (token's user, its job): what the refusal says
        ("mallory", name): f"job {name}'s record belongs to user 'alice'",
        ("alice", gone): f"job {gone}'s record is gone",
    }
    for (user, job), said in cases.items():
        with HttpArtifactStore.open(shoal_server.url, tokens.mint(user, [job])) as files:
            with pytest.raises(PermissionDeniedError, match=said):
                files.put_bytes(f"{job}/x", b"x")
    # The token of its owner, for the job that has not ended, writes.
    with HttpArtifactStore.open(shoal_server.url, tokens.mint("alice", [name])) as files:
        files.put_bytes(f"{name}/x", b"x")
    assert team.artifacts.get_bytes(f"{name}/x") == b"x"


def test_a_batch_token_writes_a_jobs_files_only_while_that_job_runs(shoal_server, team):
    tokens = JobTokens(shoal_server.home / "server" / "job-token-secret")
    tag = _tag()
    done, running = f"batch-done-{tag}", f"batch-running-{tag}"
    for name in (done, running):
        team.jobs.metadata.create_job(JobSpec(name=JobName(name), function_name="operator.add"),
                                      key_salt="00" * 16, backend="local")
    team.jobs.metadata.update_job(done, status=JobStatus.STOPPED, reason="ended")
    batch = f"{tag}-batch"
    token = tokens.mint("alice", [done, running], batch)
    batch_file = f"_batches/{batch[:6]}/{batch}.outcomes-1.pkl"
    with HttpArtifactStore.open(shoal_server.url, token) as files:
        with pytest.raises(PermissionDeniedError, match=f"job {done} has ended \\(stopped\\)"):
            files.put_bytes(f"{done}/x", b"x")
        files.put_bytes(f"{running}/x", b"x")  # its other job still runs
        files.put_bytes(batch_file, b"x")  # and so the batch's files are written
        team.jobs.metadata.update_job(running, status=JobStatus.STOPPED, reason="ended")
        with pytest.raises(PermissionDeniedError, match="all 2 jobs of batch .* have ended"):
            files.put_bytes(batch_file, b"y")
    assert not team.artifacts.exists(f"{done}/x")
    assert team.artifacts.get_bytes(batch_file) == b"x"
