"""Endpoints end to end: real model servers (``python -m shoal.serving``) on 127.0.0.1 under
a detached supervisor, deployed with ``Model.deploy`` and called with ``Predictor``.

The tests taking ``endpoint_session`` (tests/integration/conftest.py) are the contract both backends keep: they run on the
local backend and on a real two-node Ray cluster (Ray Serve, PostgreSQL metadata, S3 store),
and nothing in them says which. The others are about the local supervisor's processes.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import shoal
from helpers import endpoint_test_session, linear_onnx, wait_until
from shoal.core.endpoints import EndpointStatus, InstanceStatus
from shoal.deserializers import CSVDeserializer, NumpyDeserializer
from shoal.endpoints import EndpointService
from shoal.errors import (
    EndpointFailedError,
    EndpointNotFound,
    InvalidArgumentError,
    InvocationError,
)
from shoal.model import Model
from shoal.predictor import Predictor
from shoal.serializers import CSVSerializer, NumpySerializer

W = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.5, -1.0]], dtype=np.float32)
B = np.array([0.25, -0.5], dtype=np.float32)

PID_HANDLER = """
import os

def model_fn(model_dir):
    return {"dir": model_dir}

def predict_fn(data, model):
    return {"pid": os.getpid(), "n": len(data)}
"""


def _linear_onnx(path: Path) -> None:
    """y = x @ W + b as an ONNX graph with a dynamic batch axis."""
    linear_onnx(path, W, B)


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("onnx-model")
    _linear_onnx(d / "model.onnx")
    return d


@pytest.fixture
def session(tmp_path: Path) -> Iterator[shoal.Session]:
    s = shoal.Session(home=str(tmp_path / "home"), launcher_idle_seconds=60)
    with endpoint_test_session(s, local=True):
        yield s


def _unique(name: str) -> str:
    """Endpoint names are cluster-wide on Ray Serve, and xdist workers share the cluster."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/ping", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_contract_two_instances_predict_describe_and_delete(endpoint_session, onnx_dir):
    name = _unique("linear")
    predictor = Model(model_data=onnx_dir).deploy(initial_instance_count=2, endpoint_name=name)
    x = np.array([[1, 2, 3, 4], [0, 0, 0, 0]], dtype=np.float32)
    expected = x @ W + B
    assert np.allclose(predictor.predict(x.tolist()), expected)
    predictor.serializer, predictor.deserializer = NumpySerializer(), NumpyDeserializer()
    got = predictor.predict(x)
    assert isinstance(got, np.ndarray) and np.allclose(got, expected)

    record = predictor.describe()
    assert record.status == EndpointStatus.IN_SERVICE and record.config.instance_count == 2
    assert record.model_data == str(onnx_dir) and record.serving
    assert all(i.host == "127.0.0.1" and _answers(i.url) for i in record.instances)

    predictor.delete_endpoint()
    assert endpoint_session.metadata.find_endpoint(name) is None
    wait_until(lambda: not any(_answers(i.url) for i in record.instances), 30,
               what="instances stopped answering")
    # Each instance's (replica's) log outlives the endpoint, in the store.
    wait_until(lambda: len(endpoint_session.artifacts.list_keys(f"endpoints/{name}/logs")) == 2,
               30, what="both instances' logs in the store")
    # The two instances split the host's CPUs: each server runs its share of workers (a
    # Ray Serve replica serves in its replica actor: no model-server workers there).
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    local = endpoint_session.settings.backend == "local"
    for key in endpoint_session.artifacts.list_keys(f"endpoints/{name}/logs") if local else ():
        log = endpoint_session.artifacts.get_bytes(key).decode(errors="replace")
        assert f", {share} worker{'s' if share > 1 else ''})" in log, log[-2000:]
    with pytest.raises(EndpointNotFound, match=f"'{name}'"):
        Predictor(name).predict(x.tolist())


def test_contract_two_instances_share_the_requests(endpoint_session, tmp_path, onnx_dir):
    src = _handler_dir(tmp_path, PID_HANDLER)
    name = _unique("pair")
    predictor = Model(model_data=onnx_dir, entry_point="serve.py", source_dir=str(src)).deploy(
        initial_instance_count=2, endpoint_name=name,
        batching={"max_batch_size": 4, "max_batch_delay_ms": 1})
    assert predictor.describe().config.entry_point == "serve.py"
    pids: set[int] = set()

    def both_served() -> bool:
        # A new client each time: one address spreads connections (not the requests of
        # one kept-alive connection) over the instances.
        with Predictor(name) as fresh:
            answer = fresh.predict([[1, 2]])
        assert answer["n"] == 1
        pids.add(answer["pid"])
        return len(pids) == 2

    wait_until(both_served, 60, what="requests answered by both instances")
    import httpx

    for instance in predictor.describe().instances:
        metrics = httpx.get(f"{instance.url}/metrics", timeout=5)
        assert metrics.status_code == 200 and "shoal" in metrics.text


def test_contract_autoscaling_bounds_are_kept_and_served(endpoint_session, onnx_dir):
    name = _unique("scaled")
    predictor = Model(model_data=onnx_dir).deploy(
        endpoint_name=name, initial_instance_count=1,
        managed_instance_scaling={"Status": "ENABLED", "MinInstanceCount": 1,
                                  "MaxInstanceCount": 2})
    config = predictor.describe().config
    assert (config.min_instances, config.instance_count, config.max_instances) == (1, 1, 2)
    assert np.allclose(predictor.predict([[0, 0, 0, 1]]), W[3:4] + B)


def test_contract_a_model_that_fails_to_load_fails_with_the_reason(endpoint_session, tmp_path,
                                                                   onnx_dir):
    src = _handler_dir(tmp_path, """
        def model_fn(model_dir):
            raise RuntimeError("boom while loading the model")
    """)
    name = _unique("boom")
    with pytest.raises(EndpointFailedError, match="boom while loading the model"):
        Model(model_data=onnx_dir, entry_point="serve.py", source_dir=str(src)).deploy(endpoint_name=name)
    record = EndpointService.for_session(endpoint_session).get(name)
    assert record.status == EndpointStatus.FAILED and record.serving == ()
    assert "RuntimeError" in record.failure_reason
    assert "boom while loading the model" in record.failure_reason
    # The instance's (replica's) log is kept in the store, as `shoal endpoints describe` says.
    artifacts = endpoint_session.artifacts
    wait_until(lambda: artifacts.list_keys(f"endpoints/{name}/logs"), 30,
               what="the failed instance's log in the store")
    logs = [artifacts.get_bytes(k) for k in artifacts.list_keys(f"endpoints/{name}/logs")]
    assert any(b"boom while loading the model" in log for log in logs)
    with pytest.raises(shoal.ShoalError, match="already exists"):
        Model(model_data=onnx_dir).deploy(endpoint_name=name)
    EndpointService.for_session(endpoint_session).delete(name)
    assert endpoint_session.metadata.find_endpoint(name) is None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _handler_dir(tmp_path: Path, code: str, name: str = "handler") -> Path:
    src = tmp_path / name
    src.mkdir()
    (src / "serve.py").write_text(textwrap.dedent(code))
    return src


def test_deploy_predict_in_three_formats_describe_and_delete(session, onnx_dir):
    predictor = Model(model_data=onnx_dir).deploy(endpoint_name="linear")
    x = np.array([[1, 2, 3, 4], [0, 0, 0, 0]], dtype=np.float32)
    expected = x @ W + B
    assert isinstance(predictor, Predictor) and predictor.endpoint_name == "linear"
    assert np.allclose(predictor.predict(x.tolist()), expected)

    predictor.serializer, predictor.deserializer = CSVSerializer(), CSVDeserializer()
    assert predictor.content_type == "text/csv" and predictor.accept == ("text/csv",)
    rows = predictor.predict(x)
    assert np.allclose(np.array(rows, dtype=float), expected)

    predictor.serializer, predictor.deserializer = NumpySerializer(), NumpyDeserializer()
    got = predictor.predict(x)
    assert isinstance(got, np.ndarray) and np.allclose(got, expected)

    record = predictor.describe()
    assert record.status == EndpointStatus.IN_SERVICE and record.model_data == str(onnx_dir)
    [instance] = record.instances
    assert instance.status == InstanceStatus.IN_SERVICE and instance.host == "127.0.0.1"
    assert _alive(instance.pid) and _alive(record.supervisor["pid"])

    predictor.delete_endpoint()
    assert session.metadata.find_endpoint("linear") is None
    assert not _alive(instance.pid)
    wait_until(lambda: not _alive(record.supervisor["pid"]), 10, what="supervisor gone")
    assert session.artifacts.exists("endpoints/linear/logs/instance-0.log")
    with pytest.raises(EndpointNotFound, match="'linear'"):
        predictor.predict(x.tolist())


def test_a_killed_instance_is_restarted_and_predictions_keep_working(session, onnx_dir):
    predictor = Model(model_data=onnx_dir).deploy(endpoint_name="phoenix")
    [before] = predictor.describe().instances
    os.kill(before.pid, signal.SIGKILL)
    # The predictor retries while the supervisor brings the instance back on its port.
    assert np.allclose(predictor.predict([[1, 1, 1, 1]]), np.ones((1, 4)) @ W + B)

    def restarted():
        [now] = session.metadata.get_endpoint("phoenix").instances
        return now if now.status == InstanceStatus.IN_SERVICE and now.restarts == 1 else None

    after = wait_until(restarted, 60, what="instance restarted")
    assert after.pid != before.pid and after.port == before.port and _alive(after.pid)
    assert session.metadata.get_endpoint("phoenix").status == EndpointStatus.IN_SERVICE
    assert np.allclose(predictor.predict([[0, 0, 0, 0]]), B[None, :])


def test_two_instances_answer_on_one_url_and_a_dead_one_gets_no_traffic(session, tmp_path,
                                                                        onnx_dir):
    import httpx

    src = _handler_dir(tmp_path, PID_HANDLER)
    predictor = Model(model_data=onnx_dir, entry_point="serve.py", source_dir=str(src)).deploy(
        initial_instance_count=2, endpoint_name="pair")
    record = predictor.describe()
    [url] = record.urls  # one address for the endpoint, on every instance's record
    pids = {i.pid for i in record.instances}
    assert len(pids) == 2 and record.config.entry_point == "serve.py"

    def answer() -> int:  # a new connection each time, as curl makes
        response = httpx.post(f"{url}/invocations", json=[[1, 2]], timeout=30)
        assert response.status_code == 200, response.text
        return int(response.json()["pid"])

    seen: set[int] = set()
    wait_until(lambda: seen.add(answer()) or seen == pids, 60, what="both instances answering")
    for instance in record.instances:  # each one's own metrics, through the shared port
        assert httpx.get(f"{instance.url}/metrics", timeout=5).status_code == 200
    killed = record.instances[0].pid
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: not _alive(killed), 30, what="the killed instance gone")
    # The dead instance's socket is closed with it: every request goes to a living one,
    # including while the supervisor brings it back (it listens only once loaded).
    answers = [answer() for _ in range(20)]
    assert killed not in answers
    assert predictor.predict([[1, 2]])["n"] == 1


def test_batching_options_reach_the_server(session, onnx_dir):
    predictor = Model(model_data=onnx_dir).deploy(endpoint_name="batched",
                                       batching={"max_batch_size": 4, "max_batch_delay_ms": 2})
    record = predictor.describe()
    assert (record.config.batching.max_batch_size, record.config.batching.max_batch_delay_ms) \
        == (4, 2.0)
    assert np.allclose(predictor.predict([[1, 0, 0, 0]]), W[0:1] + B)


def test_malformed_batching_options_are_refused_before_anything_starts(session, onnx_dir):
    with pytest.raises(InvalidArgumentError, match="max_batch_delay_ms"):
        Model(model_data=onnx_dir).deploy(endpoint_name="bad-batching",
                               batching={"max_batch_size": 4, "max_batch_delay_ms": "soon"})
    assert session.metadata.find_endpoint("bad-batching") is None


def test_model_dir_with_nothing_recognisable_fails_naming_the_files(session, tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hello")
    (junk / "weights.bin").write_bytes(b"\0")
    with pytest.raises(EndpointFailedError) as info:
        Model(model_data=junk).deploy(endpoint_name="junk")
    message = str(info.value)
    assert "'junk' failed" in message and "notes.txt" in message and "weights.bin" in message
    record = session.metadata.get_endpoint("junk")
    assert record.status == EndpointStatus.FAILED and "weights.bin" in record.failure_reason
    assert record.instances == ()
    log = session.artifacts.get_bytes("endpoints/junk/logs/instance-0.log").decode()
    assert "notes.txt" in log


def test_inference_py_raising_on_import_fails_with_its_traceback(session, tmp_path, onnx_dir):
    src = _handler_dir(tmp_path, """
        import json
        raise RuntimeError("boom while importing the handler")
    """)
    with pytest.raises(EndpointFailedError, match="boom while importing the handler") as info:
        Model(model_data=onnx_dir, entry_point="serve.py", source_dir=str(src)).deploy(endpoint_name="boom")
    assert "Traceback" in str(info.value)
    record = session.metadata.get_endpoint("boom")
    assert record.status == EndpointStatus.FAILED
    assert "Traceback" in record.failure_reason and "RuntimeError" in record.failure_reason
    log = session.artifacts.get_bytes("endpoints/boom/logs/instance-0.log").decode()
    assert "boom while importing the handler" in log
    # A failed endpoint must be deleted before its name is used again.
    with pytest.raises(shoal.ShoalError, match="already exists"):
        Model(model_data=onnx_dir).deploy(endpoint_name="boom")
    EndpointService.for_session(session).delete("boom")
    Model(model_data=onnx_dir).deploy(endpoint_name="boom").predict([[0, 0, 0, 0]])


def test_a_fixed_port_already_in_use_fails_clearly(session, onnx_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EndpointFailedError, match=f"port {port} .* already in use"):
            Model(model_data=onnx_dir).deploy(endpoint_name="busy", port=port)


def test_a_fixed_free_port_is_used(session, onnx_dir):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    predictor = Model(model_data=onnx_dir).deploy(endpoint_name="fixed", port=port)
    assert [i.port for i in predictor.describe().instances] == [port]


def test_predictor_on_an_unknown_endpoint(session):
    with pytest.raises(EndpointNotFound, match="no endpoint named 'ghost'.*shoal endpoints list"):
        Predictor("ghost").predict([1])


def test_server_errors_carry_status_code_and_message(session, onnx_dir):
    predictor = Model(model_data=onnx_dir).deploy(endpoint_name="strict")
    with pytest.raises(InvocationError) as info:
        predictor.predict([[1, 2, 3]])  # three features where the model takes four
    assert 400 <= info.value.details["status_code"] < 600
    assert "'strict' answered" in str(info.value)


def test_a_gone_supervisor_fails_the_endpoint(session, onnx_dir):
    predictor = Model(model_data=onnx_dir).deploy(endpoint_name="orphan")
    record = predictor.describe()
    os.kill(record.supervisor["pid"], signal.SIGKILL)
    wait_until(lambda: not _alive(record.supervisor["pid"]), 10, what="supervisor gone")
    # Its servers die with it, and the record says why nothing will restart them.
    wait_until(lambda: not _alive(record.instances[0].pid), 10, what="server gone")
    failed = EndpointService.for_session(session).get("orphan")
    assert failed.status == EndpointStatus.FAILED and "supervisor" in failed.failure_reason
    EndpointService.for_session(session).delete("orphan")
    assert session.metadata.find_endpoint("orphan") is None


def test_contract_estimator_deploys_its_model_data(endpoint_session, tmp_path, onnx_dir):
    from shoal.estimator import Estimator

    src = tmp_path / "train"
    src.mkdir()
    (src / "model.onnx").write_bytes((onnx_dir / "model.onnx").read_bytes())
    (src / "train.py").write_text(textwrap.dedent("""
        import os, shutil
        shutil.copy("model.onnx", os.path.join(os.environ["SM_MODEL_DIR"], "model.onnx"))
    """))
    est = Estimator(entry_point="train.py", source_dir=str(src))
    est.fit(logs=False)
    predictor = est.deploy(initial_instance_count=1)
    job = est.latest_training_job.name
    assert predictor.endpoint_name == job
    assert predictor.describe().model_data == est.model_data
    assert np.allclose(predictor.predict([[0, 0, 0, 0]]), B[None, :])


# Tries to build the model's environment first: on a loaded machine, with Ray, past 120 s.
@pytest.mark.timeout(360)
def test_contract_a_model_whose_environment_cannot_be_built_fails(endpoint_session, tmp_path,
                                                                  onnx_dir):
    deps = tmp_path / "requirements.txt"
    deps.write_text("shoal-no-such-package-anywhere==9.9.9\n")
    name = _unique("noenv")
    with pytest.raises(EndpointFailedError, match="environment could not be built"):
        Model(model_data=onnx_dir, dependencies=str(deps)).deploy(endpoint_name=name)
    record = EndpointService.for_session(endpoint_session).get(name)
    assert record.status == EndpointStatus.FAILED
    assert "shoal-no-such-package-anywhere" in record.failure_reason


# Builds the handler's own environment (six) first: on a loaded machine, with Ray, past 120 s.
@pytest.mark.timeout(360)
def test_contract_a_model_server_that_exits_in_its_environment_fails_with_its_output(
        endpoint_session, tmp_path, onnx_dir):
    src = _handler_dir(tmp_path, """
        import six  # from code/requirements.txt: the model has its own environment
        raise SystemExit("the handler gave up at import")
    """)
    (src / "requirements.txt").write_text("six==1.16.0\n")
    name = _unique("exits")
    with pytest.raises(EndpointFailedError, match="the handler gave up at import"):
        Model(model_data=onnx_dir, entry_point="serve.py", source_dir=str(src)).deploy(endpoint_name=name)
    record = EndpointService.for_session(endpoint_session).get(name)
    assert record.status == EndpointStatus.FAILED and record.serving == ()
    artifacts = endpoint_session.artifacts
    wait_until(lambda: artifacts.list_keys(f"endpoints/{name}/logs"), 30,
               what="the instance's log in the store")
    logs = [artifacts.get_bytes(k) for k in artifacts.list_keys(f"endpoints/{name}/logs")]
    assert any(b"the handler gave up at import" in log for log in logs)  # the server's output


@pytest.mark.slow
def test_contract_requirements_give_the_model_its_own_environment(endpoint_session, tmp_path,
                                                                   onnx_dir):
    """dependencies= (the deployer's requirements) and the model's code/requirements.txt: the
    model server runs in an environment built from both (on Ray: on the replica's node, and
    the replica forwards to it)."""
    src = _handler_dir(tmp_path, """
        import sys
        import six
        import toolz

        def model_fn(model_dir):
            return None

        def predict_fn(data, model):
            return {"six": six.__version__, "toolz": toolz.__version__, "python": sys.executable}
    """)
    (src / "requirements.txt").write_text("toolz==0.12.1\n")
    deps = tmp_path / "deployer-requirements.txt"
    deps.write_text("six==1.16.0\n")
    predictor = Model(model_data=onnx_dir, entry_point="serve.py", source_dir=str(src),
                      dependencies=str(deps)).deploy(endpoint_name=_unique("own-env"))
    answer = predictor.predict([[1]])
    assert (answer["six"], answer["toolz"]) == ("1.16.0", "0.12.1")
    assert Path(answer["python"]).parent.parent.parent == endpoint_session.home / "envs"
    assert answer["python"] != sys.executable
