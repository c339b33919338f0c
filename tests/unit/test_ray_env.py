"""The environment ``shoal ray up`` gives Ray's processes (no Ray needed)."""

from pathlib import Path

from shoal.backends.ray_cluster import ray_env


def test_nodes_get_token_auth_and_a_patient_serve_proxy_health_check(tmp_path: Path) -> None:
    token = tmp_path / "auth_token"
    env = ray_env(token, {"RAY_AUTH_TOKEN": "stale", "PATH": "/bin"})
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(token)
    assert "RAY_AUTH_TOKEN" not in env and env["PATH"] == "/bin"
    # Serve's default (10 s) lost the proxy of a loaded 2-core node mid-deploy.
    assert float(env["RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"]) >= 30
    assert float(env["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]) >= 30


def test_a_users_own_proxy_health_check_setting_wins(tmp_path: Path) -> None:
    env = ray_env(tmp_path / "t", {"RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "5"})
    assert env["RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"] == "5"
