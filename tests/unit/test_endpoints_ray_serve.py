"""Endpoints on Ray Serve, the parts that need no cluster: deployment options, autoscaling
bounds, the replicas' environment, Serve's failure message and the route prefix on records."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shoal.core.endpoints import (
    EndpointConfig,
    EndpointInstance,
    EndpointRecord,
    EndpointStatus,
)
from shoal.endpoints import _ray_serve
from shoal.errors import InvalidArgumentError


def test_replicas_reserve_their_instance_type_and_route_over_every_replica():
    options = _ray_serve.deployment_options(
        EndpointConfig(instance_count=2, instance_type="ml.g5.xlarge"), {"A": "1"})
    assert options["num_replicas"] == 2 and "autoscaling_config" not in options
    actor = options["ray_actor_options"]
    assert (actor["num_cpus"], actor["num_gpus"], actor["memory"]) == (4.0, 1.0, 16 * 1024 ** 3)
    assert actor["runtime_env"] == {"env_vars": {"A": "1"}}
    assert options["request_router_config"]["request_router_class"].endswith(":SpreadRouter")
    local = _ray_serve.deployment_options(EndpointConfig(), {}, spread=False)
    assert local["ray_actor_options"]["num_cpus"] == 1.0 and "num_gpus" not in local[
        "ray_actor_options"]
    assert "request_router_config" not in local


def test_managed_instance_scaling_becomes_serve_autoscaling():
    low, high = EndpointConfig.parse_scaling(
        {"Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 4})
    config = EndpointConfig(instance_count=2, min_instances=low, max_instances=high)
    assert EndpointConfig.from_json(config.to_json()) == config
    options = _ray_serve.deployment_options(config, {})
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4,
                                             "initial_replicas": 2}
    assert EndpointConfig.parse_scaling({"Status": "DISABLED", "MinInstanceCount": 1}) == (
        None, None)


@pytest.mark.parametrize("low, count, high", [(3, 2, 4), (1, 5, 4), (1, 1, None), (-1, 1, 2)])
def test_autoscaling_bounds_must_hold_the_initial_count(low, count, high):
    with pytest.raises(InvalidArgumentError, match="MinInstanceCount|autoscaling"):
        EndpointConfig(instance_count=count, min_instances=low, max_instances=high)


def test_replicas_get_the_clients_environment_less_machine_and_shoal_variables():
    config = EndpointConfig(env={"OPTION_DTYPE": "fp32"}, entry_point="serve.py")
    env = _ray_serve.replica_env({"AWS_ENDPOINT_URL_S3": "http://s3", "PATH": "/client/bin",
                                  "SHOAL_HOME": "/client", "RAY_AUTH_MODE": "token",
                                  "HOME": "/root", "XDG_CONFIG_HOME": "/client/.config"},
                                 config)
    assert env == {"AWS_ENDPOINT_URL_S3": "http://s3", "OPTION_DTYPE": "fp32",
                   "SAGEMAKER_PROGRAM": "inference.py", "PYTHONUNBUFFERED": "1"}


def test_replicas_of_a_team_servers_endpoint_get_none_of_its_credentials():
    config = EndpointConfig(env={"HF_TOKEN": "the deployer's"})
    env = _ray_serve.replica_env({"AWS_SECRET_ACCESS_KEY": "s", "AWS_ACCESS_KEY_ID": "k",
                                  "PGPASSWORD": "p", "LANG": "C.UTF-8",
                                  "SHOAL_ENDPOINT_CREDENTIALS": "withhold"}, config)
    assert env == {"LANG": "C.UTF-8", "HF_TOKEN": "the deployer's", "PYTHONUNBUFFERED": "1"}


def test_a_fixed_port_is_refused_on_serve_before_anything_starts():
    _ray_serve.check_config(EndpointConfig(requirements=True))  # built on the replica's node
    with pytest.raises(InvalidArgumentError, match="port="):
        _ray_serve.check_config(EndpointConfig(port=9000))


def test_a_failed_application_keeps_the_replicas_own_traceback():
    app = {"status": "DEPLOY_FAILED", "message": "Failed to update the deployments ['model'].",
           "deployments": {"model": {"message": (
               "The deployment failed to start 3 times in a row. Error:\n\x1b[36mray::Serve"
               "Replica\x1b[39m\nTraceback (most recent call last):\n  File \"replica.py\"\n"
               "RuntimeError: wrapped\nTraceback (most recent call last):\n  File \"serve.py\", "
               "line 3, in model_fn\nRuntimeError: boom while loading the model")}}}
    reason = _ray_serve._app_message(app)
    assert reason.startswith("Ray Serve could not start the endpoint's replicas (The "
                             "deployment failed to start 3 times in a row. Error:):")
    assert reason.endswith("RuntimeError: boom while loading the model")
    assert "wrapped" not in reason and "\x1b" not in reason


def test_instances_of_a_serve_endpoint_answer_under_its_route_prefix():
    now = datetime.now(UTC)
    record = EndpointRecord("digits", EndpointStatus.IN_SERVICE, "s3://b/m", EndpointConfig(),
                            now, now, instances=(EndpointInstance(0, "127.0.0.1", 8000),),
                            supervisor={"backend": "ray-serve",
                                        "route_prefix": "/endpoints/digits"})
    assert _ray_serve.is_serve(record)
    assert record.instances[0].url == "http://127.0.0.1:8000/endpoints/digits"
    assert EndpointInstance(0, "127.0.0.1", 8000).url == "http://127.0.0.1:8000"


def test_a_replica_token_touches_its_endpoints_files_and_model_only():
    from shoal.server._jobtokens import EndpointToken

    token = EndpointToken("alice", "ep", "job-1/output/model.tar.gz")
    for key in ("endpoints/ep/model/model.tar.gz", "endpoints/ep/code/code.tar.gz",
                "endpoints/ep/env/requirements.txt", "job-1/output/model.tar.gz"):
        assert token.may_touch_key(key, write=False), key
        assert not token.may_touch_key(key, write=True), key
    assert token.may_touch_key("endpoints/ep/logs/replica-1.log", write=True)
    for key in ("endpoints/other/model/m.onnx", "job-1/output/other.tar.gz", "endpoints/ep",
                "endpoints/ep/../other/model/m.onnx", "job-1/output/model.tar.gz.bak",
                "endpoints/ep/secrets/x"):
        assert not token.may_touch_key(key, write=False), key
    directory = EndpointToken("alice", "ep", "job-1/output/model")
    assert directory.may_touch_key("job-1/output/model/weights.bin", write=False)
    assert not directory.may_touch_key("job-1/output/model-2/weights.bin", write=False)


def test_a_team_servers_replicas_fetch_their_files_through_it():
    from shoal.core.endpoints import ReplicaAccess

    class Jobs:
        checked: list[dict[str, str]] = []

        def alive_nodes(self) -> int:
            return 2

        def check_submission(self, env):
            self.checked.append(dict(env))

    jobs = Jobs()
    serve = _ray_serve.RayServeEndpoints(
        jobs, None, env={"SHOAL_METADATA_URL": "sqlite:///server.db"}, home="/srv",  # type: ignore[arg-type]
        proxy_location="HeadOnly", host="127.0.0.1", port=8000, resolve_ttl_s=60,
        replica_access=lambda name, model: ReplicaAccess(
            "http://10.0.0.5:8765", f"shoale_{name}", model.rpartition("artifacts/")[2]))
    files = serve._files("ep", "file:///srv/artifacts/endpoints/ep/model/model.tar.gz",
                         "endpoints/ep/code/code.tar.gz", None)
    # The nodes must reach the server (not its stores), and the replicas get no store URL.
    assert jobs.checked == [{"SHOAL_SERVER_URL": "http://10.0.0.5:8765"}]
    assert files == {"server": {"url": "http://10.0.0.5:8765", "token": "shoale_ep"},
                     "model_key": "endpoints/ep/model/model.tar.gz",
                     "code_key": "endpoints/ep/code/code.tar.gz", "requirements_key": None,
                     "logs_key": "endpoints/ep/logs"}
