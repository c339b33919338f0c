"""JobService on an in-memory backend (``MemoryBackend``), a real SQLite store and real local
artifacts: the test plays the supervisor, so each use case is checked without processes."""

from __future__ import annotations

import operator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from helpers import FakeClock, memory_job_service
from shoal.backends.memory import MemoryBackend
from shoal.core import FailureKind, JobName, JobSpec, JobStatus
from shoal.core.ports import Backend, JobQuery
from shoal.errors import (
    ConfigError,
    JobCancelledError,
    JobFailedError,
    LaunchError,
    PayloadIntegrityError,
)
from shoal.jobs.keys import JOB_SECRETS_VAR, take_handover
from shoal.jobs.service import JobService
from shoal.serialization import serialize


def _submit(svc: JobService, name: str = "divide-1", *args: object) -> JobName:
    spec = JobSpec(name=JobName(name), function_name="operator.truediv")
    return svc.submit_function(spec, operator.truediv, args or (6, 3), {}).name


def _as_supervisor(svc: JobService, root: Path, name: str) -> JobService:
    """The supervisor's own JobService: same stores, no user secret, only the job's secret
    as handed over in the environment its backend was asked to start it with."""
    assert isinstance(svc.backend, MemoryBackend)
    sup = memory_job_service(root, backend=svc.backend, keys=False)
    sup.hand_over(take_handover(dict(svc.backend.context(name).env)))
    return sup


def test_the_memory_backend_is_a_backend() -> None:
    assert isinstance(MemoryBackend(), Backend)


def test_submit_records_the_job_checks_and_launches_its_supervisor(tmp_path: Path) -> None:
    svc = memory_job_service(tmp_path)
    backend = svc.backend
    assert isinstance(backend, MemoryBackend)
    name = _submit(svc)
    record = svc.get(name)
    assert record.status == JobStatus.PENDING
    assert record.backend == "memory"
    ctx = backend.context(name)
    assert (ctx.entrypoint, ctx.args) == ("shoal.session:supervisor_main", (name,))
    assert ctx.env["SHOAL_HOME"] == str(tmp_path)
    # Only this job's secret is handed over, and the record points at the launched supervisor.
    assert set(take_handover(dict(ctx.env))) == {name}
    assert record.handle == backend.handle(name)
    assert backend.checked == [{"SHOAL_HOME": str(tmp_path)}]
    # The supervisor, which has no user secret, can verify the payloads it was handed.
    sup = _as_supervisor(svc, tmp_path, name)
    assert sup.get_payload(name, "function").data


def test_a_refused_submission_records_nothing(tmp_path: Path) -> None:
    refusal = ConfigError("the stores are on this machine only; use shared stores")
    svc = memory_job_service(tmp_path, backend=MemoryBackend(refuse_submissions=refusal))
    with pytest.raises(ConfigError, match="shared stores"):
        _submit(svc)
    assert svc.metadata.list_jobs(JobQuery()) == []
    assert isinstance(svc.backend, MemoryBackend) and svc.backend.launched == []


def test_a_launch_failure_fails_the_job_with_the_reason(tmp_path: Path) -> None:
    backend = MemoryBackend(refuse_launches=LaunchError("no launcher answers"))
    svc = memory_job_service(tmp_path, backend=backend)
    record = svc.get(_submit(svc))
    assert record.status == JobStatus.FAILED
    assert record.failure_kind == FailureKind.INTERNAL
    assert record.failure_reason == "could not start the supervisor: no launcher answers"
    with pytest.raises(JobFailedError, match="no launcher answers"):
        svc.outcome(record)


def test_cancel_asks_a_live_supervisor_to_stop(tmp_path: Path) -> None:
    svc = memory_job_service(tmp_path)
    name = _submit(svc)
    assert svc.cancel(name).status == JobStatus.STOPPING
    assert isinstance(svc.backend, MemoryBackend) and svc.backend.stop_requests == [name]
    # The supervisor records the end; the outcome then says the job was stopped.
    _as_supervisor(svc, tmp_path, name).transition(name, JobStatus.STOPPED, reason="stopped")
    with pytest.raises(JobCancelledError, match=name):
        svc.outcome(svc.wait(name, timeout=5))


def test_cancel_when_the_supervisor_is_gone_records_it_stopped(tmp_path: Path) -> None:
    svc = memory_job_service(tmp_path)
    name = _submit(svc)
    assert isinstance(svc.backend, MemoryBackend)
    svc.backend.exit(name)
    record = svc.cancel(name)
    assert record.status == JobStatus.STOPPED
    assert [e.reason for e in svc.get(name).events][-2:] == ["stop requested",
                                                             "stopped (supervisor gone)"]
    assert svc.backend.stop_requests == []


def test_the_reaper_fails_a_job_whose_supervisor_exited(tmp_path: Path) -> None:
    svc = memory_job_service(tmp_path)
    gone, alive = _submit(svc, "divide-gone"), _submit(svc, "divide-alive")
    assert isinstance(svc.backend, MemoryBackend)
    svc.backend.exit(gone)
    assert svc.reap() == [gone]
    record = svc.get(gone)
    assert record.status == JobStatus.FAILED
    assert record.failure_kind == FailureKind.SUPERVISOR_LOST
    assert f"its supervisor (pid {record.handle['pid']}" in (record.failure_reason or "")
    assert "exited without reporting" in (record.failure_reason or "")
    assert svc.get(alive).status == JobStatus.PENDING
    with pytest.raises(JobFailedError, match="exited without reporting an end state"):
        svc.outcome(record)


def test_the_reaper_fails_a_job_no_supervisor_took_after_the_grace_period(
        tmp_path: Path) -> None:
    clock = FakeClock(datetime.now(UTC))  # the store records created_at on the system clock
    svc = memory_job_service(tmp_path, clock=clock)
    # Recorded, never launched (its client died between the two): no handle on the record.
    name = svc.metadata.create_job(JobSpec(name=JobName("orphan-1")), key_salt="s",
                                   backend="memory").name
    assert svc.reap() == []
    clock.advance(121)
    assert svc.reap() == [name]
    record = svc.get(name)
    assert record.failure_kind == FailureKind.SUPERVISOR_LOST
    assert "no supervisor was started for 1" in (record.failure_reason or "")


def test_wait_returns_the_recorded_end_and_outcome_the_result(tmp_path: Path) -> None:
    svc = memory_job_service(tmp_path)
    name = _submit(svc, "divide-7", 7, 2)
    with pytest.raises(TimeoutError, match=f"job {name} is still pending"):
        svc.wait(name, timeout=0.05)
    sup = _as_supervisor(svc, tmp_path, name)
    for status in (JobStatus.STARTING, JobStatus.RUNNING):
        sup.advance(name, status)
    sup.put_payloads(name, {"results": serialize(3.5, sup.payload_key(name), what="result")})
    sup.advance(name, JobStatus.COMPLETED, exit_code=0)
    seen: list[JobStatus] = []
    record = svc.wait(name, timeout=5, on_status=lambda r: seen.append(r.status))
    assert (record.status, seen) == (JobStatus.COMPLETED, [JobStatus.COMPLETED])
    assert svc.outcome(record) == 3.5


def test_outcome_of_a_user_error_raises_the_remote_exception(tmp_path: Path) -> None:
    svc = memory_job_service(tmp_path)
    name = _submit(svc, "divide-0", 1, 0)
    sup = _as_supervisor(svc, tmp_path, name)
    exc = ZeroDivisionError("division by zero")
    sup.put_payloads(name, {"exception": serialize(
        {"exception": exc, "traceback": "Traceback ...\nZeroDivisionError"},
        sup.payload_key(name), what="exception")})
    sup.transition(name, JobStatus.FAILED, failure_kind=FailureKind.USER_ERROR,
                   reason="ZeroDivisionError: division by zero")
    with pytest.raises(ZeroDivisionError, match="division by zero") as raised:
        svc.outcome(svc.wait(name, timeout=5))
    assert any(f"Remote traceback (job {name})" in note for note in raised.value.__notes__)
    assert isinstance(raised.value.__cause__, JobFailedError)


def test_a_job_recorded_without_its_client_secret_cannot_be_verified(tmp_path: Path) -> None:
    """A supervisor that was not handed a job's secret refuses to verify its payloads."""
    svc = memory_job_service(tmp_path)
    name = _submit(svc)
    stranger = memory_job_service(tmp_path, backend=svc.backend, keys=False)
    with pytest.raises(PayloadIntegrityError, match=JOB_SECRETS_VAR):
        stranger.payload_key(name)


def test_a_batch_goes_to_one_supervisor_and_its_jobs_fail_when_it_exits(tmp_path: Path) -> None:
    svc = memory_job_service(tmp_path)
    specs = [JobSpec(name=JobName(f"divide-b{i}"), function_name="operator.truediv")
             for i in range(2)]
    batch = svc.submit_batch(specs, operator.truediv, [((6, 3), {}), ((1, 4), {})])
    backend = svc.backend
    assert isinstance(backend, MemoryBackend)
    [ctx] = backend.launched
    assert ctx.batch == batch.names and ctx.args == (ctx.job, *batch.names)
    assert set(take_handover(dict(ctx.env))) == set(batch.names)
    for name in batch.names:
        record = svc.get(name)
        assert (record.status, record.handle) == (JobStatus.PENDING, backend.handle(name))
        # Each job's function and arguments are in its batch's files, verifiable by the
        # supervisor it was handed to.
        assert _as_supervisor(svc, tmp_path, name).get_payload(name, "arguments").data
    backend.exit(batch.names[0])
    assert sorted(svc.reap()) == sorted(batch.names)
    assert {svc.get(n).failure_kind for n in batch.names} == {FailureKind.SUPERVISOR_LOST}


def _running(svc: JobService, name: str, attempt: int) -> None:
    """Play the supervisor: the job starts its attempt *attempt* and runs."""
    svc.advance(name, JobStatus.STARTING, expected=JobStatus.PENDING, attempt=attempt)
    svc.advance(name, JobStatus.RUNNING, expected=JobStatus.STARTING)


def test_a_lost_supervisor_with_an_attempt_left_is_relaunched_once(tmp_path: Path) -> None:
    svc = memory_job_service(tmp_path)
    spec = JobSpec(name=JobName("divide-retry"), function_name="operator.truediv",
                   max_retry_attempts=2)
    name = svc.submit_function(spec, operator.truediv, (6, 3), {}).name
    assert isinstance(svc.backend, MemoryBackend)
    _running(svc, name, 1)
    first = svc.get(name).handle
    svc.backend.exit(name)
    stale = svc.get(name)
    assert svc.reap() == [name]
    record = svc.get(name)
    assert record.status == JobStatus.PENDING and record.attempt == 1
    assert record.handle == svc.backend.handle(name) != first  # a new supervisor
    assert len(svc.backend.launched) == 2
    [why] = [e.reason for e in record.events if e.reason and "ended" in e.reason]
    assert why.startswith("attempt 1 of 2 ended: its supervisor (pid")
    # A second reaper that read the record before the relaunch changes nothing.
    assert svc._reap_one(stale) is False and len(svc.backend.launched) == 2
    _running(svc, name, 2)
    svc.backend.exit(name)
    assert svc.reap() == [name]  # the last attempt lost: the job fails
    record = svc.get(name)
    assert record.status == JobStatus.FAILED and record.attempt == 2
    assert record.failure_kind == FailureKind.SUPERVISOR_LOST


def test_each_attempt_says_whether_its_node_or_only_its_supervisor_was_lost(
        tmp_path: Path) -> None:
    """A backend that tells a lost node from a killed supervisor process (Ray's): the event of
    each attempt says which, naming the node, and a last attempt lost with its node fails
    the job as node_lost (issue #23, items 2 and 3)."""
    svc = memory_job_service(tmp_path)
    spec = JobSpec(name=JobName("divide-nodes"), function_name="operator.truediv",
                   max_retry_attempts=3)
    name = svc.submit_function(spec, operator.truediv, (6, 3), {}).name
    assert isinstance(svc.backend, MemoryBackend)
    _running(svc, name, 1)
    svc.backend.lose_node(name, "node-7")
    assert svc.reap() == [name]
    _running(svc, name, 2)
    svc.backend.exit(name)  # the supervisor's process alone: its node lives
    assert svc.reap() == [name]
    _running(svc, name, 3)
    svc.backend.lose_node(name, "node-9")
    assert svc.reap() == [name]
    record = svc.get(name)
    ended = [e.reason or "" for e in record.events if "ended:" in (e.reason or "")]
    assert len(ended) == 2, ended
    assert ended[0].startswith("attempt 1 of 3 ended: its supervisor (pid 1 on memory) was "
                               "lost with its node: node node-7 is declared dead")
    assert ended[1].startswith("attempt 2 of 3 ended: its supervisor (pid 2 on memory) exited "
                               "without reporting an end state: its process was killed while "
                               "its node, node memory, still runs")
    assert record.status == JobStatus.FAILED and record.attempt == 3
    assert record.failure_kind == FailureKind.NODE_LOST
    assert "node node-9 is declared dead" in (record.failure_reason or "")
    with pytest.raises(JobFailedError, match="lost with its node: node node-9"):
        svc.outcome(record)


class _Unanswering(MemoryBackend):
    """A backend whose cluster stopped answering (a Ray head that went away)."""

    def is_alive(self, handle: object) -> bool | None:
        from shoal.errors import BackendUnavailableError

        raise BackendUnavailableError("the cluster at 'head:6379' did not answer",
                                      address="head:6379")


def test_a_backend_that_does_not_answer_ends_a_wait_in_bounded_time(tmp_path: Path) -> None:
    from shoal.errors import BackendUnavailableError

    svc = memory_job_service(tmp_path, backend=_Unanswering())
    name = _submit(svc, "divide-headless")
    _running(svc, name, 1)
    assert svc.reap() == [] and svc.liveness_unknown is not None  # unknown, not failed
    svc.backend_wait_seconds = 0.5
    with pytest.raises(BackendUnavailableError, match="'head:6379'") as e:
        svc.wait(name, timeout=30)
    assert name in str(e.value) and "Wait again" in str(e.value)
    assert svc.get(name).status == JobStatus.RUNNING  # the record is left as it was
