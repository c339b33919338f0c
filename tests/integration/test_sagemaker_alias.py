"""Issue #22 item 8: ``shoal alias install`` makes unmodified SageMaker code run on shoal in a
fresh environment, and refuses where a real ``sagemaker`` distribution is installed.

The environment is a new ``uv venv`` (not --system-site-packages): it sees this worktree's
``src`` and the test venv's site-packages (shoal's dependencies) through a ``.pth`` file, and
nothing named sagemaker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import shoal

SRC = Path(shoal.__file__).resolve().parents[1]
UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))


def _venv(root: Path) -> tuple[Path, Path]:
    if not Path(UV).exists():
        pytest.skip("uv is not installed")
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig;"
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = sysconfig.get_paths()["purelib"]
    (site / "shoal-test-paths.pth").write_text(f"{SRC}\n{deps}\n")
    return python, site


def _run(python: Path, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_unmodified_sagemaker_code_runs_after_alias_install(tmp_path):
    python, site = _venv(tmp_path / "venv")
    env = {**os.environ, "SHOAL_HOME": str(tmp_path / "home"), "PYTHONPATH": ""}
    probe = _run(python, "-c", "import sagemaker", cwd=tmp_path, env=env)
    assert probe.returncode != 0 and "No module named 'sagemaker'" in probe.stderr

    done = _run(python, "-m", "shoal.cli", "alias", "install", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert (site / "shoal-sagemaker-alias.pth").is_file()
    script = tmp_path / "notebook.py"
    script.write_text(textwrap.dedent("""
        import sagemaker
        from sagemaker.remote_function import remote
        from sagemaker.session import Session

        @remote(instance_type="ml.m5.large", sagemaker_session=Session())
        def divide(x, y):
            return x / y

        print("answer", divide(10, 4))
        print("same module", sagemaker.Session is __import__("shoal").Session)
    """))
    ran = _run(python, str(script), cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    assert "answer 2.5" in ran.stdout and "same module True" in ran.stdout
    missing = _run(python, "-c", "import sagemaker.workflow.pipeline", cwd=tmp_path, env=env)
    assert "shoal (installed as the 'sagemaker' alias) has no shoal.workflow" in missing.stderr

    status = _run(python, "-m", "shoal.cli", "alias", "status", cwd=tmp_path, env=env)
    assert "alias: installed" in status.stdout and "real sagemaker: none" in status.stdout
    gone = _run(python, "-m", "shoal.cli", "alias", "uninstall", cwd=tmp_path, env=env)
    assert gone.returncode == 0 and not (site / "shoal-sagemaker-alias.pth").exists()
    assert _run(python, "-c", "import sagemaker", cwd=tmp_path, env=env).returncode != 0


def test_alias_install_refuses_over_a_real_sagemaker(tmp_path):
    python, site = _venv(tmp_path / "venv")
    dist = site / "sagemaker-2.232.0.dist-info"  # what pip leaves for the real SDK
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sagemaker\nVersion: 2.232.0\n")
    (dist / "RECORD").write_text("")
    env = {**os.environ, "SHOAL_HOME": str(tmp_path / "home"), "PYTHONPATH": ""}
    refused = _run(python, "-m", "shoal.cli", "alias", "install", cwd=tmp_path, env=env)
    assert refused.returncode != 0
    assert "'sagemaker' distribution 2.232.0" in refused.stderr + refused.stdout
    assert not (site / "shoal-sagemaker-alias.pth").exists()
