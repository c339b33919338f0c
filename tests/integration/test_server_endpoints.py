"""Endpoints through the team server: a real ``shoal server`` process on 127.0.0.1 runs them
on its own backend, under its own home, with its own settings; clients deploy with
``Model.deploy``, call them with ``Predictor`` and manage them with ``shoal endpoints`` over
real HTTP with real tokens.

The ONNX model of tests/integration/test_endpoints.py, deployed from the client's disk (it goes
up through the server's artifact store); owners (another user's delete is 403 naming the
owner); ``Estimator.deploy`` of a model its job trained on the server; a failing model's reason
and a gone supervisor's, seen by another user through the server and a refused deploy that records
nothing; and model servers that receive none of the server's credentials, also on a server
over PostgreSQL and S3 whose supervisor stages the model from S3 with the server's own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shoal
from helpers import linear_onnx, wait_until
from shoal.client import HttpEndpointBackend
from shoal.core.endpoints import (
    EndpointConfig,
    EndpointInstance,
    EndpointStatus,
    InstanceStatus,
    RuntimeState,
    endpoint_dir,
)
from shoal.endpoints import EndpointService
from shoal.errors import (
    BackendUnavailableError,
    EndpointFailedError,
    EndpointNotFound,
    EndpointNotInServiceError,
    EndpointUnreachableError,
    InvalidArgumentError,
    InvocationError,
    PermissionDeniedError,
)
from shoal.model import Model
from shoal.predictor import Predictor

W = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.5, -1.0]], dtype=np.float32)
B = np.array([0.25, -0.5], dtype=np.float32)


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("onnx-model")
    linear_onnx(d / "model.onnx", W, B)
    return d


def _token(server: Any, user: str) -> str:
    made = server.cli("tokens", "create", "--user", user, "--name",
                      f"laptop-{uuid.uuid4().hex[:8]}", "--create-user", "--scope", "write")
    assert made.returncode == 0, made.stderr
    return str(made.stdout.strip())


def _client_env(tmp_path: Path, url: str, token: str | None, who: str) -> dict[str, str]:
    """A client's environment: its own empty home, the server's URL and its token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(SHOAL_HOME=str(tmp_path / f"{who}-home"),
               XDG_CONFIG_HOME=str(tmp_path / f"{who}-xdg"), SHOAL_SERVER_URL=url)
    if token is not None:
        env["SHOAL_TOKEN"] = token
    return env


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``client(env)``: a session of that client environment, in use; on the way out every
    endpoint it left on the server is deleted (the server runs them, detached)."""
    made: list[shoal.Session] = []
    stack: list[Any] = []

    def start(env: dict[str, str]) -> shoal.Session:
        for name in [k for k in os.environ if k.startswith("SHOAL_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        session = shoal.Session()
        made.append(session)
        use = shoal.use(session)
        use.__enter__()
        stack.append(use)
        return session

    try:
        yield start
    finally:
        for use in reversed(stack):
            use.__exit__(None, None, None)
        for session in made:
            try:
                service = EndpointService.for_session(session)
                for record in service.list():
                    if record.owner in ("local", "alice"):
                        service.delete(record.name)
            finally:
                session.close()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/ping", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _handler_dir(tmp_path: Path, code: str) -> Path:
    src = tmp_path / f"handler-{uuid.uuid4().hex[:6]}"
    src.mkdir()
    (src / "serve.py").write_text(textwrap.dedent(code))
    return src


def test_deploy_predict_list_describe_and_delete_through_the_server(
        shoal_server, client, tmp_path, onnx_dir):
    alice = _client_env(tmp_path, shoal_server.url, _token(shoal_server, "alice"), "alice")
    session = client(alice)
    name = f"linear-{uuid.uuid4().hex[:8]}"
    predictor = Model(model_data=str(onnx_dir)).deploy(endpoint_name=name)
    x = np.array([[1, 2, 3, 4], [0, 0, 0, 0]], dtype=np.float32)
    assert np.allclose(predictor.predict(x.tolist()), x @ W + B)

    record = predictor.describe()
    assert record.status == EndpointStatus.IN_SERVICE and record.owner == "alice"
    # The model went up to the server's store; its servers run on the server's host, from
    # the server's home; the client's home holds nothing of it.
    assert record.model_data.startswith(f"file://{shoal_server.home}/artifacts/endpoints/{name}/")
    assert record.urls and all(_answers(u) for u in record.urls)
    where = endpoint_dir(shoal_server.home, name)
    [instance] = record.instances
    assert instance.host == "127.0.0.1" and instance.pid
    assert str(where) in Path(f"/proc/{instance.pid}/cmdline").read_bytes().decode()
    assert not endpoint_dir(session.home, name).exists()

    listed = _cli(alice, "endpoints", "list")
    assert listed.returncode == 0, listed.stderr
    assert name in listed.stdout and "alice" in listed.stdout
    described = _cli(alice, "endpoints", "describe", name, "--json")
    assert described.returncode == 0, described.stderr
    shown = json.loads(described.stdout)
    assert shown["owner"] == "alice" and shown["status"] == "InService"
    invoked = _cli(alice, "endpoints", "invoke", name, "--body", "[[0, 0, 0, 1]]")
    assert invoked.returncode == 0, invoked.stderr
    assert np.allclose(json.loads(invoked.stdout), W[3:4] + B)

    # Bob reads it and calls it, but may not delete it: 403 naming its owner and the action.
    bob = _client_env(tmp_path, shoal_server.url, _token(shoal_server, "bob"), "bob")
    refused = _cli(bob, "endpoints", "delete", name)
    assert refused.returncode != 0
    assert "'bob' may not delete endpoint" in refused.stderr and "'alice'" in refused.stderr
    as_bob = shoal.Session(server_url=shoal_server.url, token=bob["SHOAL_TOKEN"],
                           home=bob["SHOAL_HOME"])
    try:
        # Nor replace or remove the files its supervisor stages (its model, its code).
        with pytest.raises(PermissionDeniedError, match="files of endpoint"):
            as_bob.artifacts.put_bytes(f"endpoints/{name}/code/code.tar.gz", b"not alice's")
        with pytest.raises(PermissionDeniedError, match="files of endpoint"):
            as_bob.artifacts.delete_prefix(f"endpoints/{name}/model")
        with pytest.raises(PermissionDeniedError, match="every endpoint's files"):
            as_bob.artifacts.delete_prefix("endpoints")
        for change in (lambda s: s.delete(name),
                       lambda s: s.metadata.update_endpoint(name, status=EndpointStatus.FAILED),
                       lambda s: s.metadata.set_endpoint_supervisor(name, {"pid": 1})):
            with pytest.raises(PermissionDeniedError, match="belongs to 'alice'"):
                change(EndpointService.for_session(as_bob))
    finally:
        as_bob.close()
    assert _cli(bob, "endpoints", "describe", name).returncode == 0
    assert np.allclose(predictor.predict([[0, 0, 0, 1]]), W[3:4] + B)  # still serving

    deleted = _cli(alice, "endpoints", "delete", name)
    assert deleted.returncode == 0, deleted.stderr
    assert EndpointService.for_session(session).find(name) is None
    wait_until(lambda: not any(_answers(u) for u in record.urls), 30,
               what="the endpoint's server stopped answering")
    assert not where.exists()  # the server's copy of the model is gone too
    assert not session.artifacts.list_keys(f"endpoints/{name}/model")


def _invoke(url: str, name: str, token: str | None, body: bytes = b"[[1, 2, 3, 4]]",
            content_type: str = "application/json") -> Any:
    import httpx

    headers = {"Content-Type": content_type, "Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(f"{url}/api/v1/endpoints/{name}/invocations", content=body,
                      headers=headers, timeout=60)


def _read_token(server: Any, user: str) -> str:
    made = server.cli("tokens", "create", "--user", user, "--name",
                      f"reader-{uuid.uuid4().hex[:8]}", "--create-user", "--scope", "read")
    assert made.returncode == 0, made.stderr
    return str(made.stdout.strip())


def test_endpoints_are_invoked_through_the_servers_route(shoal_server, client, tmp_path,
                                                         onnx_dir):
    """The SageMaker-runtime shape: ``POST /api/v1/endpoints/{name}/invocations`` passes the
    request on to the model server on the server's host and its answer back, so a client
    needs nothing but the server's URL and a token."""
    token = _token(shoal_server, "alice")
    alice = _client_env(tmp_path, shoal_server.url, token, "alice")
    session = client(alice)
    name = f"proxied-{uuid.uuid4().hex[:8]}"
    predictor = Model(model_data=str(onnx_dir)).deploy(endpoint_name=name)
    x = np.array([[1, 2, 3, 4], [0, 1, 0, 1]], dtype=np.float32)
    assert np.allclose(predictor.predict(x.tolist()), x @ W + B)
    assert predictor._client is None  # never a direct connection to the model server

    answer = _invoke(shoal_server.url, name, token)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-shoal-endpoint"] == name
    assert answer.headers["content-type"].startswith("application/json")
    assert np.allclose(answer.json(), x[:1] @ W + B)

    # The model server's refusal passes through with its status, as an InvocationError.
    refused = _invoke(shoal_server.url, name, token, b"1,2,3,4", "application/x-bogus")
    assert refused.status_code == 415 and refused.headers["x-shoal-endpoint"] == name
    with pytest.raises(InvocationError, match="answered 415") as info:
        predictor.predict(None, initial_args={"ContentType": "application/x-bogus",
                                              "Body": b"1,2,3,4"})
    assert info.value.details["status_code"] == 415
    assert shoal_server.url in str(info.value)

    # The server's own errors: unknown endpoint, no token, a read token, too large a body.
    missing = _invoke(shoal_server.url, "no-such-endpoint", token)
    assert missing.status_code == 404 and "x-shoal-endpoint" not in missing.headers
    assert missing.json()["error"]["code"] == "ENDPOINT_NOT_FOUND"
    with pytest.raises(EndpointNotFound, match="no-such-endpoint"):
        Predictor("no-such-endpoint").predict([[0, 0, 0, 0]])
    anonymous = _invoke(shoal_server.url, name, None)
    assert anonymous.status_code == 401, anonymous.text
    reader = _invoke(shoal_server.url, name, _read_token(shoal_server, "carol"))
    assert reader.status_code == 403 and "needs a write token" in reader.text
    big = _invoke(shoal_server.url, name, token, b"[" + b"0," * (3 * 1024 * 1024) + b"0]")
    assert big.status_code == 413 and "SHOAL_SERVER_MAX_INVOCATION_BYTES" in big.text

    # A record not started by the server (no runtime yet): 503 naming its status.
    pending = f"pending-{uuid.uuid4().hex[:8]}"
    session.endpoint_store.create_endpoint(pending, model_data="m", config=EndpointConfig())
    waiting = _invoke(shoal_server.url, pending, token)
    assert waiting.status_code == 503 and "Creating" in waiting.json()["error"]["message"]
    with pytest.raises(EndpointNotInServiceError, match="Creating, not InService"):
        Predictor(pending).predict([[0, 0, 0, 0]])
    EndpointService.for_session(session).delete(pending)

    # `shoal endpoints invoke` goes the same way; `describe` shows the route.
    invoked = _cli(alice, "endpoints", "invoke", name, "--body", "[[0, 0, 1, 0]]")
    assert invoked.returncode == 0, invoked.stderr
    assert np.allclose(json.loads(invoked.stdout), W[2:3] + B)
    described = _cli(alice, "endpoints", "describe", name, "--json")
    assert described.returncode == 0, described.stderr
    route = f"{shoal_server.url}/api/v1/endpoints/{name}/invocations"
    assert json.loads(described.stdout)["invocation_url"] == route
    shown = _cli(alice, "endpoints", "describe", name)
    assert route in shown.stdout.replace("\n", "")

    # Its owner may not point the route elsewhere: an instance address the server's runtime
    # did not report is refused (the supervisor on the server's host records its own).
    record = predictor.describe()
    with pytest.raises(PermissionDeniedError, match="started by this server.*127.0.0.1:9"):
        session.endpoint_store.put_endpoint_instance(name, EndpointInstance(
            0, "127.0.0.1", 9, None, InstanceStatus.IN_SERVICE))
    assert predictor.describe().instances == record.instances

    # Its model server gone (and its supervisor, so nothing restarts it): 502 naming it.
    os.kill(int(record.supervisor["pid"]), signal.SIGKILL)
    for instance in record.instances:
        os.kill(int(instance.pid or 0), signal.SIGKILL)
    wait_until(lambda: not any(_answers(u) for u in record.urls), 30,
               what="the model server gone")
    gone = _invoke(shoal_server.url, name, token)
    assert gone.status_code == 502, gone.text
    assert gone.json()["error"]["code"] == "ENDPOINT_UNREACHABLE" and name in gone.text
    with pytest.raises(EndpointUnreachableError, match=name):
        Predictor(name, connect_retry_seconds=0.5).predict([[0, 0, 0, 0]])
    predictor.delete_endpoint()


def test_estimator_deploys_the_model_its_job_trained_on_the_server(shoal_server, client,
                                                                   tmp_path, onnx_dir):
    from shoal.estimator import Estimator

    client(_client_env(tmp_path, shoal_server.url, _token(shoal_server, "alice"), "alice"))
    src = tmp_path / "train"
    src.mkdir()
    (src / "model.onnx").write_bytes((onnx_dir / "model.onnx").read_bytes())
    (src / "train.py").write_text(textwrap.dedent("""
        import os, shutil
        shutil.copy("model.onnx", os.path.join(os.environ["SM_MODEL_DIR"], "model.onnx"))
    """))
    est = Estimator(entry_point="train.py", source_dir=str(src))
    est.fit(logs=False)
    # The job's model is already in the server's store: deployed from there, not uploaded.
    assert est.model_data.startswith(f"file://{shoal_server.home}/artifacts/")
    predictor = est.deploy(initial_instance_count=1)
    record = predictor.describe()
    assert record.model_data == est.model_data and record.owner == "alice"
    assert np.allclose(predictor.predict([[0, 0, 0, 0]]), B[None, :])
    predictor.delete_endpoint()
    assert EndpointService.for_session(shoal.session.current()).find(record.name) is None


def test_a_failing_model_shows_its_failure_through_the_server(shoal_server, client, tmp_path,
                                                             onnx_dir):
    alice = _client_env(tmp_path, shoal_server.url, _token(shoal_server, "alice"), "alice")
    session = client(alice)
    service = EndpointService.for_session(session)

    # A model the server could read but the deployer need not: refused, nothing recorded.
    name = f"elsewhere-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidArgumentError, match="not in this server's artifact store"):
        Model(model_data="s3://another-bucket/model.tar.gz").deploy(endpoint_name=name)
    assert service.find(name) is None
    # The server refuses it too, to a client that records one itself.
    store = session.endpoint_store
    store.create_endpoint(name, model_data=f"file://{shoal_server.home}/shoal.db",
                          config=EndpointConfig())
    with pytest.raises(InvalidArgumentError, match="not in this server's artifact store"):
        HttpEndpointBackend(session.server_connection()).deploy(
            name, model_data="ignored", config=EndpointConfig(), code_key=None,
            requirements_key=None)
    assert not store.get_endpoint(name).supervisor  # nothing was started
    service.delete(name)
    assert service.find(name) is None

    src = _handler_dir(tmp_path, """
        def model_fn(model_dir):
            raise RuntimeError("boom while loading the model")
    """)
    name = f"boom-{uuid.uuid4().hex[:8]}"
    with pytest.raises(EndpointFailedError, match="boom while loading the model"):
        Model(model_data=str(onnx_dir), entry_point="serve.py",
              source_dir=str(src)).deploy(endpoint_name=name)
    record = service.get(name)
    assert record.status == EndpointStatus.FAILED and record.serving == ()
    assert "RuntimeError" in (record.failure_reason or "")
    with pytest.raises(shoal.ShoalError, match="boom while loading the model"):
        Predictor(name).predict([[0, 0, 0, 0]])
    described = _cli(alice, "endpoints", "describe", name)
    assert described.returncode == 0 and "boom while loading the model" in described.stdout
    logs = session.artifacts.list_keys(f"endpoints/{name}/logs")
    assert any(b"boom while loading" in session.artifacts.get_bytes(k) for k in logs)

    service.delete(name)
    assert service.find(name) is None
    assert not endpoint_dir(shoal_server.home, name).exists()
    assert not session.artifacts.list_keys(f"endpoints/{name}/code")


def test_a_reader_sees_an_endpoint_whose_supervisor_is_gone_fail(shoal_server, client,
                                                                  tmp_path, onnx_dir):
    alice = _client_env(tmp_path, shoal_server.url, _token(shoal_server, "alice"), "alice")
    client(alice)
    predictor = Model(model_data=str(onnx_dir)).deploy()
    record = predictor.describe()
    os.kill(int(record.supervisor["pid"]), signal.SIGKILL)  # on the server's host (this one)
    bob = _client_env(tmp_path, shoal_server.url, _token(shoal_server, "bob"), "bob")

    errors: list[str] = []

    def failed_for_bob() -> dict[str, Any] | None:
        listed = _cli(bob, "endpoints", "list", "--json")
        if listed.returncode != 0:
            errors.append(listed.stderr)
            return None
        [mine] = [r for r in json.loads(listed.stdout) if r["name"] == record.name]
        return mine if mine["status"] == "Failed" else None

    shown = wait_until(failed_for_bob, 60, what="bob seeing the endpoint Failed")
    assert not errors, errors  # a reader's look never fails on the owner's record (403)
    assert "supervisor" in shown["failure_reason"] and shown["owner"] == "alice"
    wait_until(lambda: not any(_answers(u) for u in record.urls), 30,
               what="its model server gone with its supervisor")
    predictor.delete_endpoint()
    assert not endpoint_dir(shoal_server.home, record.name).exists()


def test_the_server_signals_no_process_a_clients_handle_names(shoal_server, client, tmp_path):
    alice = _client_env(tmp_path, shoal_server.url, _token(shoal_server, "alice"), "alice")
    session = client(alice)
    store, runtime = session.endpoint_store, HttpEndpointBackend(session.server_connection())
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        name = f"forged-{uuid.uuid4().hex[:8]}"
        store.create_endpoint(name, model_data="m", config=EndpointConfig())
        forged = {"backend": "local", "pid": bystander.pid, "host": "127.0.0.1"}
        store.set_endpoint_supervisor(name, forged)  # the owner may write it...
        store.put_endpoint_instance(name, EndpointInstance(0, "127.0.0.1", 1, bystander.pid))
        record = store.get_endpoint(name)
        # ...but the server neither looks at nor stops what it did not start (no seal).
        assert runtime.refresh(record).state == RuntimeState.UNCHANGED
        with pytest.raises(BackendUnavailableError, match="not started by this server"):
            runtime.delete(record, timeout=5)
        store.set_endpoint_supervisor(name, {})
        runtime.delete(store.get_endpoint(name), timeout=5)  # an instance's pid: not a server
        assert bystander.poll() is None  # still running: never signalled
        assert store.delete_endpoint(name)
    finally:
        bystander.kill()
        bystander.wait(timeout=10)


ENV_HANDLER = """
import os

def model_fn(model_dir):
    return None

def predict_fn(data, model):
    return {k: os.environ.get(k) for k in sorted(os.environ)}
"""


def test_model_servers_get_none_of_the_servers_credentials(own_shoal_server, client, tmp_path,
                                                          onnx_dir):
    server_env = {"AWS_ACCESS_KEY_ID": "AKIASERVER", "AWS_SECRET_ACCESS_KEY": "server-secret",
                  "PGPASSWORD": "pg-secret", "TEAM_API_TOKEN": "team-token",
                  "REPORTS_URL": "postgresql://svc:db-secret@db.internal/reports",
                  "SERVER_HARMLESS": "kept"}
    # (Its launcher goes soon after the endpoint does: no process outlives the test long.)
    _, url, home = own_shoal_server("--no-auth", env={**server_env,
                                                      "SHOAL_LAUNCHER_IDLE_SECONDS": "5"})
    client(_client_env(tmp_path, url, None, "local"))
    src = _handler_dir(tmp_path, ENV_HANDLER)
    predictor = Model(model_data=str(onnx_dir), entry_point="serve.py", source_dir=str(src),
                      env={"MY_OWN_TOKEN": "the deployer's"}).deploy()
    seen = predictor.predict([[0, 0, 0, 0]])
    for name in server_env.keys() - {"SERVER_HARMLESS"}:
        assert name not in seen, f"{name} reached the model server"
    assert not any(v and "secret" in v for v in seen.values())
    assert not [k for k in seen if k.startswith("SHOAL_")]
    assert seen["SERVER_HARMLESS"] == "kept"  # the server's other settings stay
    assert seen["MY_OWN_TOKEN"] == "the deployer's"  # the deployer's own env= is theirs
    record = predictor.describe()
    assert str(endpoint_dir(home, record.name)) in Path(
        f"/proc/{record.instances[0].pid}/cmdline").read_bytes().decode()


@pytest.mark.postgres
@pytest.mark.s3
def test_an_endpoint_on_a_postgres_and_s3_server_reads_its_model_from_s3(
        own_shoal_server, client, tmp_path, onnx_dir, postgres_url, s3_bucket_url,
        moto_server, monkeypatch):
    """The team set-up: the server's supervisor stages the model from S3 with the server's
    credentials; the model server gets none of them; the client holds none."""
    from shoal.storage.sql import upgrade_schema

    url, _options = s3_bucket_url
    upgrade_schema(postgres_url)
    _, server_url, home = own_shoal_server("--no-auth", env={
        "SHOAL_METADATA_URL": postgres_url, "SHOAL_ARTIFACT_URL": url,
        "AWS_ENDPOINT_URL_S3": moto_server, "SHOAL_LAUNCHER_IDLE_SECONDS": "5"})
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)  # the server has them; this client holds none
    session = client(_client_env(tmp_path, server_url, None, "local"))
    src = _handler_dir(tmp_path, ENV_HANDLER)
    predictor = Model(model_data=str(onnx_dir), entry_point="serve.py",
                      source_dir=str(src)).deploy()
    record = predictor.describe()
    assert record.model_data.startswith(f"{url}/endpoints/{record.name}/model/")
    assert session.artifacts.exists(f"endpoints/{record.name}/model/model.tar.gz")
    seen = predictor.predict([[0, 0, 0, 0]])
    assert not [k for k in seen if k.startswith(("AWS_", "SHOAL_", "PG"))], sorted(seen)
    assert not any(v and ("testing" == v or postgres_url in v) for v in seen.values())
    predictor.delete_endpoint()
    assert not session.artifacts.list_keys(f"endpoints/{record.name}/model")
    assert not endpoint_dir(home, record.name).exists()


def test_a_replica_token_reaches_only_its_endpoints_files(shoal_server, tmp_path):
    """What the server gives an endpoint's Ray Serve replicas (server/_jobtokens.py): its
    model, code and requirements to read and its logs to write, while it exists, nothing
    else; the replicas of a server on Ray fetch through it with this token (their end-to-end
    test is tests/integration/test_server_ray.py)."""
    from shoal.client import HttpArtifactStore, ServerConnection
    from shoal.errors import AuthenticationError
    from shoal.server._jobtokens import JobTokens

    name = f"replica-{uuid.uuid4().hex[:8]}"
    alice = shoal.Session(server_url=shoal_server.url, token=_token(shoal_server, "alice"),
                          home=str(tmp_path / "alice-home"))
    model = f"endpoints/{name}/model/model.onnx"
    try:
        for key in (model, f"endpoints/{name}/code/code.tar.gz",
                    f"endpoints/{name}/env/requirements.txt", f"someone-{name}/output/x.bin"):
            alice.artifacts.put_bytes(key, key.encode())
        alice.endpoint_store.create_endpoint(name, model_data=alice.artifacts.uri(model),
                                             config=EndpointConfig())
        minter = JobTokens(shoal_server.home / "server" / "job-token-secret")
        token = minter.mint_endpoint("alice", name, model)
        with HttpArtifactStore.open(shoal_server.url, token) as replica:
            for key in (model, f"endpoints/{name}/code/code.tar.gz",
                        f"endpoints/{name}/env/requirements.txt"):
                assert replica.get_bytes(key) == key.encode()
            assert replica.list_keys(f"endpoints/{name}/model/") == [model]
            replica.put_bytes(f"endpoints/{name}/logs/replica-1.log", b"started")
            refusals = [
                lambda: replica.get_bytes(f"someone-{name}/output/x.bin"),
                lambda: replica.list_keys("endpoints/"),
                lambda: replica.put_bytes(model, b"not the deployer's"),
                lambda: replica.put_bytes(f"endpoints/{name}/code/code.tar.gz", b"no"),
                lambda: replica.delete_prefix(f"endpoints/{name}/logs"),
            ]
            for refused in refusals:
                with pytest.raises(PermissionDeniedError,
                                   match=f"replica token of endpoint {name}"):
                    refused()
            with ServerConnection(shoal_server.url, token) as http:
                for method, path in (("GET", "/jobs"), ("GET", f"/endpoints/{name}"),
                                     ("POST", f"/endpoints/{name}/invocations"),
                                     ("GET", "/experiments")):
                    with pytest.raises(PermissionDeniedError, match=f"call {method} {path}"):
                        http.call(method, path, json={} if method == "POST" else None)
            # Another user's token for alice's endpoint writes nothing; none once it is gone.
            with HttpArtifactStore.open(shoal_server.url,
                                        minter.mint_endpoint("bob", name, model)) as bobs:
                with pytest.raises(PermissionDeniedError, match="belongs to 'alice', not to the token's user 'bob'"):
                    bobs.put_bytes(f"endpoints/{name}/logs/replica-2.log", b"bob's")
            alice.endpoint_store.delete_endpoint(name)
            assert replica.get_bytes(model) == model.encode()  # reads stay
            with pytest.raises(PermissionDeniedError, match="is gone"):
                replica.put_bytes(f"endpoints/{name}/logs/replica-3.log", b"late")
        forged = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
        with HttpArtifactStore.open(shoal_server.url, forged) as forger:
            with pytest.raises(AuthenticationError, match="replica token is not valid"):
                forger.get_bytes(model)
        assert alice.artifacts.get_bytes(f"endpoints/{name}/logs/replica-1.log") == b"started"
    finally:
        alice.artifacts.delete_prefix(f"endpoints/{name}")
        alice.artifacts.delete_prefix(f"someone-{name}")
        alice.close()
