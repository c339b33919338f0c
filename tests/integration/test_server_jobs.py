"""Jobs through the team server: a real ``shoal server`` process on 127.0.0.1 runs them on
its own backend, under its own home; clients reach it over real HTTP with real tokens.

What a job's token may reach, the per-user job keys and the launch route's refusals; then
``@remote``, ``RemoteExecutor.map`` on warm workers, ``get_future``/``list_futures``,
``Estimator.fit``, ``shoal jobs logs -f`` and a server killed mid-job."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

from shoal.client import HttpJobKeys, ServerConnection
from shoal.core import JobQuery, JobStatus
from shoal.core.api import MAX_JOB_SECRETS_PER_REQUEST
from shoal.errors import AuthenticationError, InvalidArgumentError, PermissionDeniedError
from shoal.server._jobtokens import JobTokens


def _token(server: Any, user: str, name: str, *extra: str) -> str:
    made = server.cli("tokens", "create", "--user", user, "--name", name, "--create-user",
                      *extra)
    assert made.returncode == 0, made.stderr
    return str(made.stdout.strip())


def _job_tokens(server: Any) -> JobTokens:
    """The server's own minter (its secret file under its home: this test runs as its user)."""
    return JobTokens(server.home / "server" / "job-token-secret")


def test_a_job_token_reaching_another_job_is_403_naming_both(shoal_server):
    token = _job_tokens(shoal_server).mint("alice", ["own-job-1"])
    with ServerConnection(shoal_server.url, token) as http:
        with pytest.raises(PermissionDeniedError) as info:
            http.call("GET", "/jobs/other-job-2/wait", params={"timeout": "0"})
        assert "job own-job-1" in info.value.message and "other-job-2" in info.value.message
        with pytest.raises(PermissionDeniedError, match="metrics of 'job:other-job-2'"):
            http.call("GET", "/metrics", params={"owner": "job:other-job-2"})
        for method, path in (("GET", "/experiments"), ("POST", "/keys/job-secret"),
                             ("POST", "/launches")):
            with pytest.raises(PermissionDeniedError, match=f"call {method} {path}"):
                http.call(method, path, json={})
        assert http.call("GET", "/whoami")["user"] == "alice"
    forged = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
    with ServerConnection(shoal_server.url, forged) as http:
        with pytest.raises(AuthenticationError, match="job token is not valid"):
            http.call("GET", "/whoami")


def test_job_secrets_are_per_user_and_never_given_to_a_job_token(shoal_server):
    alice = _token(shoal_server, "alice", "keys-a", "--scope", "write")
    bob = _token(shoal_server, "bob", "keys-b", "--scope", "write")
    with ServerConnection(shoal_server.url, alice) as a1, \
            ServerConnection(shoal_server.url, bob) as b:
        first = HttpJobKeys(a1).secret("keyed-job", "00" * 16)
        assert len(first) == 64
        assert HttpJobKeys(a1).secret("keyed-job", "11" * 16) != first  # salt matters
        assert HttpJobKeys(b).secret("keyed-job", "00" * 16) != first  # another user's secret
    with ServerConnection(shoal_server.url, alice) as a2:
        assert HttpJobKeys(a2).secret("keyed-job", "00" * 16) == first  # kept by the server
    secrets = sorted((shoal_server.home / "server" / "user-secrets").iterdir())
    assert len(secrets) >= 2 and all(p.stat().st_mode & 0o077 == 0 for p in secrets)
    job = _job_tokens(shoal_server).mint("alice", ["keyed-job"])
    with ServerConnection(shoal_server.url, job) as http:
        with pytest.raises(PermissionDeniedError, match="keyed-job"):
            HttpJobKeys(http).secret("keyed-job", "00" * 16)


class _Counted(ServerConnection):
    """A real connection that also lists the requests it made."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(url, token)
        self.calls: list[tuple[str, str]] = []

    def call(self, method, path, **kwargs):
        self.calls.append((method, path))
        return super().call(method, path, **kwargs)


def test_a_batchs_job_secrets_come_in_one_request_and_match_one_by_one(shoal_server):
    """A map's batch of 64 asked the server for its jobs' secrets 64 times (2 ms each here,
    two thirds of the server's time per call of a map); ``secrets`` asks once."""
    alice = _token(shoal_server, "alice", "keys-batch", "--scope", "write")
    pairs = [(f"batch-job-{i}", f"{i:032x}") for i in range(70)]
    with _Counted(shoal_server.url, alice) as many, ServerConnection(shoal_server.url,
                                                                     alice) as one:
        keys = HttpJobKeys(many)
        got = keys.secrets([*pairs, pairs[0]])  # a repeat is answered from what was asked
        assert got == [HttpJobKeys(one).secret(j, s) for j, s in [*pairs, pairs[0]]]
        assert many.calls == [("POST", "/keys/job-secrets")]
        assert keys.secrets(pairs[:3]) == got[:3] and len(many.calls) == 1  # cached
        with pytest.raises(InvalidArgumentError, match="jobs"):
            many.call("POST", "/keys/job-secrets", json={"jobs": [
                {"job": f"j{i}", "salt": "00"} for i in range(MAX_JOB_SECRETS_PER_REQUEST + 1)]})
    job = _job_tokens(shoal_server).mint("alice", ["batch-job-0"])
    with ServerConnection(shoal_server.url, job) as http:
        with pytest.raises(PermissionDeniedError, match="call POST /keys/job-secrets"):
            HttpJobKeys(http).secrets(pairs[:1])


def test_the_launch_route_starts_only_shoals_supervisor(shoal_server):
    token = _token(shoal_server, "alice", "launcher", "--scope", "write")
    with ServerConnection(shoal_server.url, token) as http:
        with pytest.raises(InvalidArgumentError, match="only shoal's supervisor"):
            http.call("POST", "/launches", json={"job": "j", "entrypoint": "os:system",
                                                 "args": ["j"]})
    with httpx.Client(base_url=shoal_server.url) as client:
        paths = set(client.get("/api/v1/openapi.json").json()["paths"])
    assert {"/api/v1/launches", "/api/v1/jobs/{name}/wait", "/api/v1/jobs/{name}/logs",
            "/api/v1/keys/job-secret", "/api/v1/keys/job-secrets"} <= paths


# --- jobs through the server, end to end -----------------------------------------------------

def test_remote_runs_on_the_servers_backend_under_its_home(team, shoal_server, capsys,
                                                           tmp_path):
    from shoal import remote

    @remote
    def where(x):
        import os

        print("running in", os.environ["SHOAL_HOME"])
        return x * 2, os.environ["SHOAL_HOME"], os.environ.get("SHOAL_METADATA_URL")

    value, home, metadata_url = where(21)
    assert value == 42
    assert home == str(shoal_server.home) and metadata_url is None  # all-HTTP, server's home
    assert f"running in {shoal_server.home}" in capsys.readouterr().out  # log streamed back
    [record] = team.jobs.metadata.list_jobs(JobQuery(name_prefix="where-"))
    assert record.status == JobStatus.COMPLETED and record.handle["pid"] > 0
    assert (shoal_server.home / "work").is_dir()
    assert not (tmp_path / "client-home" / "work").exists()  # nothing ran on the client
    assert not (tmp_path / "client-xdg" / "shoal" / "user-secret").exists()  # no user secret


def test_map_is_batched_on_a_warm_worker_of_the_server(team):
    from shoal import RemoteExecutor

    def square(x):
        import os

        return x * x, os.getpid()

    with RemoteExecutor(keep_alive_period_in_seconds=30, max_parallel_jobs=1) as e:
        out = list(e.map(square, range(12)))
        again = e.submit(square, 5).result(timeout=120)  # the warm worker takes it too
    assert [v for v, _ in out] == [x * x for x in range(12)] and again[0] == 25
    records = team.jobs.metadata.list_jobs(JobQuery(name_prefix="square-", limit=100))
    assert len(records) == 13 and all(r.status == JobStatus.COMPLETED for r in records)
    assert {r.spec.batch.id for r in records if r.spec.batch is not None}  # handed over as batches
    assert len({r.handle["pid"] for r in records}) <= 2  # one warm supervisor (its first + map)


def test_get_future_and_list_futures_through_the_server(team):
    from shoal import remote
    from shoal.remote_function import get_future, list_futures

    @remote
    def triple(x):
        return 3 * x

    assert triple(4) == 12
    [record] = team.jobs.metadata.list_jobs(JobQuery(name_prefix="triple-"))
    assert get_future(record.name).result(timeout=60) == 12
    assert [f.result(timeout=60) for f in list_futures("triple-")] == [12]


def test_a_jobs_own_token_reading_another_jobs_record_is_403(team):
    from shoal import remote

    @remote
    def first():
        return "done"

    assert first() == "done"
    [other] = team.jobs.metadata.list_jobs(JobQuery(name_prefix="first-"))

    @remote
    def snoop(name):
        import os

        import httpx

        headers = {"Authorization": f"Bearer {os.environ['SHOAL_TOKEN']}"}
        url = os.environ["SHOAL_SERVER_URL"] + "/api/v1"
        theirs = httpx.get(f"{url}/jobs/{name}", headers=headers)
        key = httpx.get(f"{url}/artifacts", params={"key": f"{name}/logs/output.log"},
                        headers=headers)
        return theirs.status_code, theirs.json()["error"]["message"], key.status_code

    status, message, key_status = snoop(other.name)
    [me] = team.jobs.metadata.list_jobs(JobQuery(name_prefix="snoop-"))
    assert (status, key_status) == (403, 403)
    assert me.name in message and other.name in message  # names both jobs


def test_estimator_fit_runs_its_script_on_the_server(team, tmp_path):
    from shoal.estimator import Estimator

    script = tmp_path / "train.py"
    script.write_text("import os\nprint('training in', os.environ['SM_MODEL_DIR'])\n"
                      "open(os.path.join(os.environ['SM_MODEL_DIR'], 'model.txt'), 'w')"
                      ".write('weights')\n")
    est = Estimator(entry_point=str(script), sagemaker_session=team)
    est.fit(logs=False)
    record = team.jobs.get(est.latest_training_job.name)
    assert record.status == JobStatus.COMPLETED
    assert team.artifacts.exists(f"{record.name}/output/model.tar.gz")
    assert b"training in" in team.jobs.read_log(record.name)


READ_CHANNELS = """
import json, os
out = {}
for channel in ("train", "single", "earlier"):
    where = os.environ.get("SM_CHANNEL_" + channel.upper())
    if not where:
        continue
    files = {}
    for root, _, names in os.walk(where, followlinks=True):
        for n in names:
            full = os.path.join(root, n)
            files[os.path.relpath(full, where)] = open(full).read()
    out[channel] = {"real": os.path.realpath(where), "files": files}
open(os.path.join(os.environ["SM_MODEL_DIR"], "seen.json"), "w").write(json.dumps(out))
print("SEEN", json.dumps(out))
"""


def test_estimator_fit_uploads_its_local_inputs_through_the_server(team, tmp_path,
                                                                  shoal_server):
    """A local channel (a directory, a file, a file:// URI) goes up to the server's store under
    the job's prefix and the job reads it there, never the client's path (which exists on the
    server's host here only because the test shares one)."""
    import json

    from shoal.estimator import Estimator

    data = tmp_path / "data"
    (data / "part").mkdir(parents=True)
    (data / "a.csv").write_text("1,2\n")
    (data / "part" / "b.csv").write_text("3,4\n")
    single = tmp_path / "one.txt"
    single.write_text("just one file")
    script = tmp_path / "train.py"
    script.write_text(READ_CHANNELS)
    est = Estimator(entry_point=str(script), sagemaker_session=team, base_job_name="ship")
    est.fit({"train": str(data), "single": single.as_uri()}, logs=False)
    name = est.latest_training_job.name
    record = team.jobs.get(name)
    assert record.status == JobStatus.COMPLETED, record.failure_reason
    assert record.spec.training is not None
    channels = record.spec.training.channels
    root = team.artifacts.root
    assert root.startswith(f"file://{shoal_server.home}")
    assert channels["train"]["uri"] == f"{root}/{name}/input/data/train"
    assert channels["single"]["uri"] == f"{root}/{name}/input/data/single/one.txt"
    assert team.artifacts.get_bytes(f"{name}/input/data/train/part/b.csv") == b"3,4\n"
    [line] = [ln for ln in team.jobs.read_log(name).decode().splitlines()
              if ln.startswith("SEEN ")]
    seen = json.loads(line[5:])
    assert seen["train"]["files"] == {"a.csv": "1,2\n", os.path.join("part", "b.csv"): "3,4\n"}
    assert seen["single"]["files"] == {"one.txt": "just one file"}
    for channel in ("train", "single"):  # read from the server's store, not the client's disk
        assert seen[channel]["real"].startswith(str(shoal_server.home))
        assert not seen[channel]["real"].startswith(str(tmp_path))

    # A URI already in the server's store is checked there and used as it is.
    earlier = channels["train"]["uri"]
    est.fit({"earlier": earlier}, logs=False)
    again = team.jobs.get(est.latest_training_job.name)
    assert again.status == JobStatus.COMPLETED, again.failure_reason
    assert again.spec.training is not None
    assert again.spec.training.channels["earlier"]["uri"] == earlier
    assert not team.artifacts.list_keys(f"{again.name}/input/data")

    # A local path that is not there: refused at submit, naming the channel and the path,
    # with no job recorded.
    before = {r.name for r in team.jobs.metadata.list_jobs(JobQuery(name_prefix="ship"))}
    missing = tmp_path / "no-such-dir"
    with pytest.raises(InvalidArgumentError, match="channel 'train'") as info:
        est.fit({"train": str(missing)}, logs=False)
    assert str(missing) in str(info.value)
    after = {r.name for r in team.jobs.metadata.list_jobs(JobQuery(name_prefix="ship"))}
    assert after == before
    with pytest.raises(InvalidArgumentError, match="does not exist in the server's artifact"):
        est.fit({"train": f"{root}/{name}/input/data/nothing-here"}, logs=False)
    for setting in ("output_path", "checkpoint_s3_uri"):  # where the job writes: not here
        elsewhere = Estimator(entry_point=str(script), sagemaker_session=team,
                              base_job_name="ship", **{setting: str(tmp_path / "out")})
        with pytest.raises(InvalidArgumentError, match=f"{setting}=.*a path on this machine"):
            elsewhere.fit({"train": str(data)}, logs=False)
    assert {r.name for r in team.jobs.metadata.list_jobs(JobQuery(name_prefix="ship"))} \
        == before


def test_jobs_logs_follow_streams_a_running_job_through_the_server(team, tmp_path):
    import subprocess
    import sys

    from helpers import wait_until
    from shoal import RemoteExecutor

    flag = tmp_path / "go"

    def chatty(path):
        import os
        import time

        print("before the flag", flush=True)
        while not os.path.exists(path):
            time.sleep(0.05)
        print("after the flag", flush=True)
        return 1

    with RemoteExecutor() as e:
        future = e.submit(chatty, str(flag))
        wait_until(lambda: team.jobs.metadata.list_jobs(JobQuery(name_prefix="chatty-")), 60,
                   what="the job's record")
        [record] = team.jobs.metadata.list_jobs(JobQuery(name_prefix="chatty-"))
        name = record.name
        out = tmp_path / "follow.out"
        with open(out, "wb") as sink:
            cli = subprocess.Popen([sys.executable, "-m", "shoal.cli", "jobs", "logs", name,
                                    "-f"], stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: b"before the flag" in out.read_bytes(), 120,
                       what="the followed log's first line")
            assert b"after the flag" not in out.read_bytes()
            flag.touch()
            assert cli.wait(timeout=120) == 0, out.read_bytes()
        finally:
            if cli.poll() is None:
                cli.kill()
        assert future.result(timeout=60) == 1
    text = out.read_bytes()
    assert text.index(b"before the flag") < text.index(b"after the flag")


def test_a_server_killed_mid_job_and_restarted_loses_nothing(own_shoal_server, tmp_path,
                                                             monkeypatch):
    """kill -9 of the server while a job runs: the job finishes meanwhile (its reports wait
    for the server, as for a database outage), and the client waiting on it gets the result
    once the server is back on the same address and home."""
    import signal
    import threading
    from urllib.parse import urlsplit

    import shoal
    from helpers import wait_until
    from shoal import RemoteExecutor

    proc, url, home = own_shoal_server("--no-auth")
    port = urlsplit(url).port
    for name in [k for k in os.environ if k.startswith("SHOAL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SHOAL_HOME", str(tmp_path / "client-home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "client-xdg"))
    monkeypatch.setenv("SHOAL_SERVER_URL", url)
    flag = tmp_path / "go"

    def survivor(path):
        import os
        import time

        print("waiting for the flag", flush=True)
        while not os.path.exists(path):
            time.sleep(0.05)
        print("the flag is there", flush=True)
        return "survived"

    session = shoal.Session()
    try:
        with shoal.use(session), RemoteExecutor() as e:
            future = e.submit(survivor, str(flag))
            wait_until(lambda: any(r.status == JobStatus.RUNNING for r in
                                   session.jobs.metadata.list_jobs(
                                       JobQuery(name_prefix="survivor-"))),
                       120, what="the job running")
            result: list[object] = []
            waiter = threading.Thread(target=lambda: result.append(future.result(timeout=300)))
            waiter.start()  # a client waiting on the result while the server goes
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            flag.touch()  # the job ends while no server answers
            own_shoal_server("--no-auth", home=home, port=port)
            waiter.join(timeout=300)
            assert result == ["survived"]
            [record] = session.jobs.metadata.list_jobs(JobQuery(name_prefix="survivor-"))
            assert record.status == JobStatus.COMPLETED
            log = session.jobs.read_log(record.name)
            assert b"waiting for the flag" in log and b"the flag is there" in log
    finally:
        session.close()


def test_cancel_through_the_server_stops_the_job_on_its_host(team):
    from helpers import wait_until
    from shoal import RemoteExecutor

    def sleeper():
        import time

        time.sleep(600)

    with RemoteExecutor() as e:
        future = e.submit(sleeper)
        wait_until(lambda: any(r.status == JobStatus.RUNNING for r in
                               team.jobs.metadata.list_jobs(JobQuery(name_prefix="sleeper-"))),
                   120, what="the job running")
        [record] = team.jobs.metadata.list_jobs(JobQuery(name_prefix="sleeper-"))
        team.jobs.cancel(record.name)
        assert team.jobs.wait(record.name, timeout=120).status == JobStatus.STOPPED
        with pytest.raises(Exception, match="stopped"):
            future.result(timeout=60)
    with pytest.raises(Exception, match="no unfinished job has the supervisor"):
        team.jobs.backend.signal_stop({"backend": "local", "pid": 1, "host": "x"})


# --- the warm path's requests (issue #20 performance) ----------------------------------------

def _trivial(x):
    return x + 1


def test_a_warm_call_through_the_server_is_one_request_of_the_client(team, monkeypatch):
    """A warm ``submit(f, x).result()`` made four requests in a row before its job could
    start (its secret, the records, the payload file, the launch) and then long-polled; now
    the job's secret comes from the client's key lease (one ``POST /keys/lease`` per
    session), the records, the batch's files and the launch are one ``POST
    /launches/batch`` whose answer brings the worker's first news (a short call's result),
    and the worker is handed its take and has its ends recorded by the server that claimed
    it (no request of its own). Later readers derive the same secrets from the server: a
    new session verifies and reads each result."""
    from shoal import RemoteExecutor
    from shoal.core.leases import LEASE_PREFIX
    from shoal.session import Session

    connection = team.server_connection()
    calls: list[tuple[str, str]] = []
    real = connection.call

    def counted(method, path, **kwargs):
        calls.append((method, path))
        return real(method, path, **kwargs)

    with RemoteExecutor(keep_alive_period_in_seconds=60, max_parallel_jobs=1) as e:
        assert e.submit(_trivial, 1).result(timeout=120) == 2  # starts the warm worker
        monkeypatch.setattr(connection, "call", counted)
        assert [e.submit(_trivial, i).result(timeout=120) for i in range(3)] == [1, 2, 3]
        monkeypatch.setattr(connection, "call", real)
    sent = [(m, p.split("/launches/")[0] + "/launches/*" if p.endswith("/messages") else p)
            for m, p in calls]
    assert sent.count(("POST", "/launches/batch")) == 3
    assert not {("POST", "/keys/job-secrets"), ("POST", "/keys/lease"), ("POST", "/job-batches"),
                ("POST", "/launches")} & set(sent), sent
    # Else only reads, when a call outlasts the launch's wait on a loaded machine: the
    # messages' long polls, and (when a poll's slice ends first) a read of the job's record.
    assert all(m == "GET" and p.startswith(("/launches/", "/jobs/")) for m, p in sent
               if (m, p) != ("POST", "/launches/batch")), sent
    records = team.jobs.metadata.list_jobs(JobQuery(name_contains="trivial", limit=10))
    assert len(records) == 4 and all(r.status == JobStatus.COMPLETED for r in records)
    assert len({r.handle["pid"] for r in records}) == 1  # one warm worker took them all
    assert all(team.jobs.metadata.get_job_key_salt(r.name).startswith(LEASE_PREFIX)
               for r in records)
    reader = Session()  # the same server and token, a new client: no lease of its own
    try:  # no lease of its own: the server derives the secrets the results were signed with
        assert sorted(reader.jobs.outcome(reader.jobs.get(r.name)) for r in records) == \
            [1, 2, 2, 3]
    finally:
        reader.close()


def test_the_batch_launch_take_and_files_with_transitions_reach_only_their_own(shoal_server):
    """``POST /launches/batch`` stores only its batch's files and function pickles under their
    digest, before recording anything; files sent with transitions go only where their sender
    may write (a job token: its own jobs' and batch's keys)."""
    from shoal.client import HttpArtifactStore, HttpJobStore
    from shoal.core import JobName, JobSpec
    from shoal.errors import ArtifactNotFound, JobNotFound

    alice = _token(shoal_server, "alice", "batch-files", "--scope", "write")
    launch = {"job": "260101-000000-aaaaaaaaaaaa", "entrypoint": "shoal.session:supervisor_main",
              "args": ["260101-000000-aaaaaaaaaaaa", "bf-job-1"], "batch": ["bf-job-1"]}
    with ServerConnection(shoal_server.url, alice) as http:
        jobs, artifacts = HttpJobStore(http), HttpArtifactStore(http)
        with pytest.raises(InvalidArgumentError, match="'other-job/x.pkl'"):
            http.call("POST", "/launches/batch", json={
                "specs": [JobSpec(name=JobName("bf-job-1")).to_json()], "key_salts": ["00"],
                "files": {"other-job/x.pkl": "AA=="}, "launch": launch})
        with pytest.raises(InvalidArgumentError, match="_functions/"):  # not its digest
            http.call("POST", "/launches/batch", json={
                "specs": [JobSpec(name=JobName("bf-job-1")).to_json()], "key_salts": ["00"],
                "files": {"_functions/" + "0" * 64 + "/payload.pkl": "AA=="}, "launch": launch})
        assert jobs.find_job("bf-job-1") is None  # nothing was recorded
        [mine, theirs] = jobs.create_jobs([JobSpec(name=JobName("bf-job-2")),
                                           JobSpec(name=JobName("bf-job-3"))],
                                          key_salts=["00", "01"], backend="local")
    token = _job_tokens(shoal_server).mint("alice", [mine.name])
    change = {"name": mine.name, "status": "failed", "reason": "test"}
    with ServerConnection(shoal_server.url, token) as http:
        with pytest.raises(PermissionDeniedError, match=f"{theirs.name}/results/x"):
            http.call("POST", "/job-transitions", json={
                "changes": [change], "files": {f"{theirs.name}/results/x": "AA=="}})
        assert HttpJobStore(http).get_job(mine.name).status == JobStatus.PENDING  # unchanged
        with pytest.raises(PermissionDeniedError, match="calls of batch"):  # not its batch
            HttpJobStore(http).take_batch([mine.name], {"pid": 1}, "260101-000000-bbbbbbbbbbbb")
        with pytest.raises(PermissionDeniedError, match=theirs.name):
            HttpJobStore(http).take_batch([theirs.name], {"pid": 1}, "260101-000000-bbbbbbbbbbbb")
        assert HttpJobStore(http).get_job(mine.name).handle == {}  # nothing was taken
        assert http.call("POST", "/job-transitions", json={
            "changes": [change], "files": {f"{mine.name}/results/x": "aGk="}}) == [True]
    with ServerConnection(shoal_server.url, alice) as http:
        artifacts = HttpArtifactStore(http)
        assert artifacts.get_bytes(f"{mine.name}/results/x") == b"hi"
        with pytest.raises(ArtifactNotFound):
            artifacts.get_bytes(f"{theirs.name}/results/x")
        assert HttpJobStore(http).get_job(mine.name).status == JobStatus.FAILED
        with pytest.raises(JobNotFound):
            HttpJobStore(http).get_job("bf-job-1")
