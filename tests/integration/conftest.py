"""Fixtures for tests that run real jobs: a Session under tmp_path and its launcher."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import shoal


def make_session(home: Path, **settings: object) -> shoal.Session:
    settings.setdefault("launcher_idle_seconds", 60)
    return shoal.Session(home=str(home), **settings)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[shoal.Session]:
    s = make_session(tmp_path / "home")
    with shoal.use(s):
        yield s
    if s._backend is not None:
        s.backend.shutdown_launcher()
    s.close()
