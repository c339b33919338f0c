"""Every ``# type: ignore`` in src/shoal names its error code and says why (docs/architecture.md,
"Types"): the reason is a comment after it on the same line, or a comment on the line above."""

from __future__ import annotations

import re
from pathlib import Path

import shoal

IGNORE = re.compile(r"#\s*type:\s*ignore(?P<code>\[[a-z0-9,\- ]+\])?(?P<rest>.*)$")


def _unexplained() -> list[str]:
    bad = []
    root = Path(shoal.__file__).parent
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            found = IGNORE.search(line)
            if found is None:
                continue
            where = f"{path.relative_to(root.parent)}:{number}"
            if not found["code"]:
                bad.append(f"{where}: no error code")
                continue
            beside = found["rest"].strip().startswith("#")
            above = number > 1 and lines[number - 2].strip().startswith("#")
            if not (beside or above):
                bad.append(f"{where}: no reason")
    return bad


def test_every_type_ignore_names_its_code_and_reason() -> None:
    assert _unexplained() == []


def test_the_check_tells_explained_from_unexplained() -> None:
    bare = IGNORE.search("x = f()  # type: ignore")
    assert bare is not None and bare["code"] is None
    explained = IGNORE.search("x = f()  # type: ignore[arg-type]  # stub too narrow")
    assert explained is not None and explained["rest"].strip().startswith("#")
    unexplained = IGNORE.search("x = f()  # type: ignore[arg-type]")
    assert unexplained is not None and not unexplained["rest"].strip()
