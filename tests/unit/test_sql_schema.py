"""The metadata schema: code, schema.py and the Alembic migrations agree."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa

from shoal.core import JobStatus
from shoal.storage.sql import schema
from shoal.storage.sql.schema import SCHEMA_REVISION

MIGRATIONS = Path(schema.__file__).parent / "migrations"


def _head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    heads = ScriptDirectory.from_config(cfg).get_heads()
    assert len(heads) == 1, f"the migrations have several heads: {heads}"
    return heads[0]


def test_schema_revision_is_the_migrations_head() -> None:
    assert _head_revision() == SCHEMA_REVISION


class _RecordingOp:
    """Stands in for alembic.op: records the tables a migration creates (and renames)."""

    def __init__(self) -> None:
        self.tables: dict[str, list[Any]] = {}

    def create_table(self, name: str, *items: Any, **_: Any) -> None:
        self.tables[name] = list(items)

    def create_index(self, *_: Any, **__: Any) -> None:
        pass

    def alter_column(self, table: str, column: str, *, new_column_name: str | None = None,
                     **_: Any) -> None:
        if new_column_name is not None:
            for item in self.tables[table]:
                if isinstance(item, sa.Column) and item.name == column:
                    item.name = item.key = new_column_name

    def add_column(self, table: str, column: sa.Column[Any], **_: Any) -> None:
        self.tables[table].append(column)

    def execute(self, *_: Any, **__: Any) -> None:
        pass

    def get_bind(self) -> Any:
        return sa.create_engine("sqlite://")


def _load_migration(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_shoal_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tables_after_all_migrations(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    op = _RecordingOp()
    for path in sorted((MIGRATIONS / "versions").glob("*.py")):
        module = _load_migration(path)
        monkeypatch.setattr(module, "op", op)
        module.upgrade()
    return op.tables


def _quoted(text: str) -> set[str]:
    return set(re.findall(r"'([^']*)'", text))


def test_status_check_lists_exactly_the_job_statuses(monkeypatch: pytest.MonkeyPatch) -> None:
    tables = _tables_after_all_migrations(monkeypatch)
    checks = [item for item in tables["jobs"] if isinstance(item, sa.CheckConstraint)
              and "status" in str(item.sqltext)]
    assert len(checks) == 1
    assert _quoted(str(checks[0].sqltext)) == {s.value for s in JobStatus}


def test_schema_py_check_matches_the_migration(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = [c for c in schema.jobs.constraints if isinstance(c, sa.CheckConstraint)]
    assert len(checks) == 1
    assert _quoted(str(checks[0].sqltext)) == {s.value for s in JobStatus}


def test_schema_py_columns_match_the_migration(monkeypatch: pytest.MonkeyPatch) -> None:
    tables = _tables_after_all_migrations(monkeypatch)
    assert set(tables) == set(schema.metadata.tables)
    for name, items in tables.items():
        migrated = {c.name: (type(c.type), c.nullable, c.primary_key)
                    for c in items if isinstance(c, sa.Column)}
        declared = {c.name: (type(c.type), c.nullable, c.primary_key)
                    for c in schema.metadata.tables[name].columns}
        assert migrated == declared, name


def test_run_status_check_lists_exactly_the_run_statuses(monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.core import RunStatus

    tables = _tables_after_all_migrations(monkeypatch)
    migrated = [item for item in tables["runs"] if isinstance(item, sa.CheckConstraint)]
    declared = [c for c in schema.runs.constraints if isinstance(c, sa.CheckConstraint)]
    assert len(migrated) == len(declared) == 1
    assert _quoted(str(migrated[0].sqltext)) == _quoted(str(declared[0].sqltext)) == {
        s.value for s in RunStatus}


def test_a_chart_reads_the_coarsest_level_with_a_block_per_pixel_column() -> None:
    from shoal.storage.sql._metrics import read_level
    from shoal.storage.sql.schema import METRIC_BLOCK, METRIC_SPANS

    sizes = (1, METRIC_BLOCK, *METRIC_SPANS)
    for count in (0, 1, 999, 16_000, 87_168, 100_000, 348_160, 10_000_000):
        for buckets in (1, 200, 1362, 4096):
            size = read_level(count, buckets)
            assert size == 1 or count // size >= buckets  # >= 2 points a pixel column
            coarser = [s for s in sizes if s > size]
            assert not coarser or count < coarser[0] * buckets, (count, buckets)


def test_coarser_blocks_keep_the_first_lowest_and_highest_of_theirs() -> None:
    from shoal.storage.sql._metrics import _coarser

    blocks = [("o", "m", b, lo, b, float(b), hi, b, float(b))
              for b, lo, hi in ((5, 1.0, 2.0), (6, 0.5, 2.0), (7, 0.5, 3.0), (8, 9.0, 9.0))]
    # 5, 6 and 7 make block 1: the low of 6 (7's equal low comes later), the high of 7.
    assert _coarser(blocks, 4) == [("o", "m", 1, 0.5, 6, 6.0, 3.0, 7, 7.0),
                                   ("o", "m", 2, 9.0, 8, 8.0, 9.0, 8, 8.0)]
