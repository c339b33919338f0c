"""Every SHOAL_* variable shoal reads (or sets for a job) is in the README."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from shoal.config import _settings_class

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"SHOAL_[A-Z][A-Z0-9_]*[A-Z0-9]")


def _names_in_src() -> set[str]:
    """String constants that are a whole SHOAL_* name (os.environ keys, env dicts, tables),
    and the SHOAL_<FIELD> of each Settings field (pydantic-settings reads those)."""
    names = set()
    for path in (ROOT / "src" / "shoal").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and _NAME.fullmatch(node.value)):
                names.add(node.value)
    return names | {f"SHOAL_{field.upper()}" for field in _settings_class().model_fields}


def test_the_scan_finds_the_settings_it_must():
    names = _names_in_src()
    assert {"SHOAL_HOME", "SHOAL_MAX_BATCH_SIZE", "SHOAL_LAUNCHER_IDLE_SECONDS",
            "SHOAL_ORT_INTRA_OP_THREADS", "SHOAL_JOB_NAME"} <= names
    assert len(names) >= 40


def test_every_shoal_variable_read_in_src_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = sorted(n for n in _names_in_src() if f"`{n}`" not in readme)
    assert not missing, f"add these to the README's Settings section: {missing}"
