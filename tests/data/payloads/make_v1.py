"""Writes the golden format-1 payload under v1/. Run once; the output is committed.

    .venv/bin/python tests/data/payloads/make_v1.py

Never regenerate it to make a failing test pass: the test exists to catch a reader that no
longer reads what an older shoal wrote.
"""

from __future__ import annotations

from pathlib import Path

from shoal.serialization import serialize

#: The fixed key the golden payload is signed with (tests/unit/test_serialization.py too).
GOLDEN_KEY = "00112233445566778899aabbccddeeff" * 2

#: Builtin types only, so the pickle does not depend on any library's internals.
GOLDEN_OBJECT = {
    "name": "golden",
    "numbers": [1, 2.5, -3, 10**20],
    "nested": {"tuple": (1, "two", None), "flags": [True, False]},
    "bytes": b"\x00\x01\xff",
    "text": "h\u00e9llo \u2603",
}

if __name__ == "__main__":
    out = Path(__file__).parent / "v1"
    out.mkdir(exist_ok=True)
    payload = serialize(GOLDEN_OBJECT, GOLDEN_KEY, what="golden object")
    (out / "payload.pkl").write_bytes(payload.data)
    (out / "metadata.json").write_bytes(payload.metadata)
