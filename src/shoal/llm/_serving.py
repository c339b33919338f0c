"""DJL's ``serving.properties``: the file beside a model that says how to serve it.

Only reading and writing the format lives here; the LLM server that honours it is separate.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from shoal.errors import ModelLoadError

__all__ = ["DJL_DTYPES", "read_serving_properties", "write_serving_properties"]

#: torch dtype name -> DJL's ``option.dtype`` value.
DJL_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def write_serving_properties(path: Path, properties: Mapping[str, object]) -> Path:
    """Write ``key=value`` lines (``engine`` first, then sorted); booleans as true/false;
    escaped as ``java.util.Properties`` reads them back (``read_serving_properties``)."""
    def text(value: object) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    keys = sorted(properties, key=lambda k: (k != "engine", k))
    body = "".join(f"{_escape(k, key=True)}={_escape(text(properties[k]))}\n" for k in keys)
    target = path / "serving.properties" if path.is_dir() else path
    target.write_text(body, encoding="utf-8")
    return target


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}


def _escape(text: str, *, key: bool = False) -> str:
    """*text* as a properties file writes it: backslashes and control characters escaped, a
    leading space (and, in a key, any separator or comment character) too."""
    out = []
    for i, char in enumerate(text):
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif (char == " " and (key or i == 0)) or (key and char in "=:#!"):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def read_serving_properties(path: Path) -> dict[str, str]:
    """The keys and values of a serving.properties file, read as ``java.util.Properties``
    reads it (DJL does): ``=``, ``:`` or whitespace between key and value, ``\\`` line
    continuations, escapes (``\\t``, ``\\n``, ``\\uXXXX``, ``\\:``, ``\\=``), ``#`` and ``!``
    comments, leading whitespace ignored; a later key wins. UTF-8, as DJL opens the file.

    Raises ``ModelLoadError`` naming the file and the line when it cannot be parsed.
    """
    import io

    from jproperties import ParseError, Properties

    source = path / "serving.properties" if path.is_dir() else path
    data = source.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ModelLoadError(f"{source}:{line}: not UTF-8 text ({e.reason}); save "
                             f"serving.properties as UTF-8", path=str(source)) from None
    parsed = Properties()
    try:
        parsed.load(io.BytesIO(data), "utf-8")
    except ParseError as e:
        why = e.message or "malformed escape"
        raise ModelLoadError(f"{source}:{e.line_number}: cannot be read as a Java properties "
                             f"file ({why}); a \\uXXXX escape takes 4 hex digits, and a "
                             f"literal backslash is written \\\\", path=str(source),
                             line=e.line_number) from None
    return {key: value.data for key, value in parsed.items()}
