"""BatchRun (a warm worker's batch) drives its Supervisor through public members only."""

from __future__ import annotations

import ast
from pathlib import Path

import shoal.jobs._batchrun as batchrun
from shoal.jobs.driver import Supervisor


def _supervisor_attributes(tree: ast.AST) -> set[str]:
    """Attributes read or set on the supervisor: ``sup.X`` and ``self._sup.X``."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if (isinstance(value, ast.Name) and value.id == "sup") or (
                isinstance(value, ast.Attribute) and value.attr == "_sup"
                and isinstance(value.value, ast.Name) and value.value.id == "self"):
            found.add(node.attr)
    return found


def test_batchrun_touches_no_private_member_of_the_supervisor():
    used = _supervisor_attributes(ast.parse(Path(batchrun.__file__).read_text()))
    assert used, "the walk found no use of the supervisor: the test no longer looks"
    assert sorted(a for a in used if a.startswith("_")) == []
    # ...and each one it uses is the Supervisor's.
    assert sorted(a for a in used if not hasattr(Supervisor, a)) == []
