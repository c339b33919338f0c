"""The README's Python example runs as written (LitServe's test_readme habit)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import shoal

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs(clean_env: Path, tmp_path: Path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no python example"
    script = tmp_path / "readme_example.py"
    script.write_text("\n".join(blocks))
    try:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env=dict(os.environ))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "0.6666666666666666" in proc.stdout and "[0, 1, 4, 9]" in proc.stdout
        assert "/output/model.tar.gz" in proc.stdout
        assert "ok: max abs error" in proc.stdout and "(2, 10)" in proc.stdout  # ONNX + endpoint
    finally:
        session = shoal.Session(home=str(clean_env))
        session.backend.shutdown_launcher()
        session.close()
