"""`import shoal` stays light: none of the heavy dependencies load with it."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "ray", "fastapi", "uvicorn", "onnxruntime", "transformers", "sqlalchemy",
         "fsspec", "pydantic_settings", "cloudpickle")


def test_import_shoal_loads_no_heavy_module():
    code = "import shoal, sys; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True, timeout=60).stdout.split())
    assert not [m for m in HEAVY if m in loaded]


def test_the_in_job_entry_point_imports_only_what_it_needs():
    code = ("import shoal.jobs._entrypoint, sys; print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True, timeout=60).stdout.split())
    assert "sqlalchemy" not in loaded and "fsspec" not in loaded
