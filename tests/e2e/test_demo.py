"""``shoal demo`` runs the seed examples as real jobs and says how to find each one again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import shoal


def test_demo_runs_the_seed_examples_as_jobs(clean_env: Path, tmp_path: Path):
    home = tmp_path / "demo-home"
    env = {**os.environ, "SHOAL_HOME": str(home)}
    try:
        proc = subprocess.run([sys.executable, "-m", "shoal.cli", "demo"], env=env,
                              capture_output=True, text=True, timeout=240,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = proc.stdout
        assert "0.6666666666666666" in out
        assert "[0, 1, 4, 9]" in out
        assert "ZeroDivisionError" in out and "user_error" in out
        for prefix in ("divide-", "matrix-multiply-", "square-", "numpy-version-"):
            assert f"shoal jobs describe {prefix}" in out, prefix
        # The config-file job took its settings from the file.
        assert "InstanceType = 'ml.m5.large'" in out and "someTagKey" in out
        assert "EnvVarKey" in out and "EnvVarValue" not in out  # a secret-looking name
        assert "get_future(" in out

        # The jobs are in the home's history; --home finds them while SHOAL_HOME points away.
        listed = subprocess.run([sys.executable, "-m", "shoal.cli", "--home", str(home), "jobs",
                                 "list", "--json"], capture_output=True, text=True, timeout=60,
                                check=True)
        records = json.loads(listed.stdout)
        by_status = [r["status"] for r in records]
        assert by_status.count("failed") == 1  # divide(1, 0)
        assert all(s in ("completed", "failed") for s in by_status)
        for record in records:
            if not record["name"].startswith(("which-six-", "featurize-", "ready-", "add-")):
                assert record["name"] in out
        # Runtime environments: an isolated env, the shipped workdir, pre-execution, warm pool.
        assert "six 1.16.0 from" in out and "cache hit" in out
        assert "result [2, 4, 6]" in out and "scratch.tmp" not in out
        assert "preparing the job" in out
        assert "next 20 calls p50" in out
    finally:
        session = shoal.Session(home=str(home))
        session.backend.shutdown_launcher()
        session.close()
