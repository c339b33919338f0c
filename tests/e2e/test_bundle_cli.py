"""``shoal bundle build|verify`` from the command line: output, exit codes, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bundle_models import tiny_classifier


def _shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_bundle_build_reports_the_bundle_and_refuses_bad_input(tmp_path: Path):
    model = tiny_classifier(tmp_path / "tiny" / "model.onnx").parent
    out = tmp_path / "tiny-azure.zip"
    done = _shoal("bundle", "build", str(model), "--target", "azure-functions", "-o", str(out),
                  "--route", "score", "--auth-level", "anonymous")
    assert done.returncode == 0, done.stderr
    assert f"built azure-functions bundle {out}:" in done.stdout and "KB zipped" in done.stdout
    assert "float32 weights; 100.0% of 256 predictions agree with the source" in done.stdout
    assert "requirements: numpy==" in done.stdout and "azure-functions>=1.20,<2" in done.stdout
    assert f"bundle verify {out}" in done.stdout

    again = _shoal("bundle", "build", str(model), "-t", "azure-functions", "-o", str(out))
    assert again.returncode == 6
    assert again.stderr.strip() == (f"error: {out} exists; pass --force (force=True) to "
                                    "replace it")
    assert _shoal("bundle", "build", str(model), "-t", "azure-functions", "-o", str(out),
                  "--force").returncode == 0

    auth = _shoal("bundle", "build", str(model), "-t", "asgi", "-o", str(tmp_path / "a"),
                  "--auth-level", "function")
    assert auth.returncode == 2 and "applies to azure-functions bundles only" in auth.stderr

    (tmp_path / "pt").mkdir()
    (tmp_path / "pt" / "model.pt").write_bytes(b"torchscript")
    kind = _shoal("bundle", "build", str(tmp_path / "pt"), "-t", "aws-lambda", "-o",
                  str(tmp_path / "b"))
    assert kind.returncode == 2 and "holds a pytorch model (model.pt)" in kind.stderr
    assert "aws-lambda bundles take: onnx" in kind.stderr

    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    junk = _shoal("bundle", "verify", str(tmp_path / "junk.zip"))
    assert junk.returncode == 2 and "is not a bundle .zip" in junk.stderr
