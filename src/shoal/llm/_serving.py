"""DJL's ``serving.properties``: the file beside a model that says how to serve it.

Only reading and writing the format lives here; the LLM server that honours it is separate.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["DJL_DTYPES", "read_serving_properties", "write_serving_properties"]

#: torch dtype name -> DJL's ``option.dtype`` value.
DJL_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def write_serving_properties(path: Path, properties: Mapping[str, object]) -> Path:
    """Write ``key=value`` lines (``engine`` first, then sorted); booleans as true/false."""
    def text(value: object) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    keys = sorted(properties, key=lambda k: (k != "engine", k))
    body = "".join(f"{k}={text(properties[k])}\n" for k in keys)
    target = path / "serving.properties" if path.is_dir() else path
    target.write_text(body, encoding="utf-8")
    return target


def read_serving_properties(path: Path) -> dict[str, str]:
    """The ``key=value`` pairs of a serving.properties file (comments and blanks skipped)."""
    source = path / "serving.properties" if path.is_dir() else path
    out: dict[str, str] = {}
    for line in source.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip()
    return out
