"""Fixtures of the store contract suites: each runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'meta' / 'shoal.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return str(request.getfixturevalue("postgres_url"))
