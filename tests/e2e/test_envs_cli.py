"""``shoal envs list|prune`` against environments built by real jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shoal
from shoal import remote

CLI = [sys.executable, "-m", "shoal.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ), stdin=subprocess.DEVNULL)


def _six():
    import six

    return six.__version__


@pytest.mark.slow
def test_list_and_prune_environments(clean_env: Path, tmp_path: Path):
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\n")
    s = shoal.Session(home=str(clean_env), launcher_idle_seconds=60)
    try:
        assert remote(sagemaker_session=s, dependencies=str(req))(_six)() == "1.16.0"
        [env] = s.env_builder.list()
    finally:
        s.backend.shutdown_launcher()
        s.close()
    listed = _cli("envs", "list")
    assert listed.returncode == 0 and env.key[:16] in listed.stdout
    assert listed.stdout.split()[:3] == ["KEY", "PACKAGES", "SIZE"]  # the shared table style
    [as_json] = json.loads(_cli("envs", "list", "--json").stdout)
    assert as_json["key"] == env.key and as_json["size_bytes"] == env.size_bytes
    kept = _cli("envs", "prune", "--unused-for", "7d")
    assert kept.returncode == 0 and "removed 0" in kept.stdout
    pruned = _cli("envs", "prune", "--unused-for", "0")
    assert pruned.returncode == 0 and env.key[:16] in pruned.stdout
    assert not env.path.exists()
    assert "no cached environments" in _cli("envs", "list").stderr
    bad = _cli("envs", "prune", "--unused-for", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
