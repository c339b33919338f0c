"""pack_workdir / unpack_workdir: what ships, filters, determinism, the cache and safe extraction."""

from __future__ import annotations

import io
import os
import stat
import zipfile
from pathlib import Path

import pytest

from shoal.envs import workdir as workdir_module
from shoal.envs.workdir import ALWAYS_SKIPPED, PackedWorkdir, pack_workdir, unpack_workdir
from shoal.errors import InvalidArgumentError
from shoal.remote_function import CustomFileFilter

OLD_NS = 1_600_000_000 * 10**9  # 2020: old enough for the cache to trust mtimes


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    workdir_module._cache.clear()


def write(root: Path, rel: str, content: str | bytes = "x") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def names(packed: PackedWorkdir) -> set[str]:
    with zipfile.ZipFile(io.BytesIO(packed.data)) as zf:
        return set(zf.namelist())


def age(root: Path) -> None:
    """Give every file an old mtime, so the cache does not treat them as just edited."""
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            os.utime(Path(dirpath) / f, ns=(OLD_NS, OLD_NS))


def test_ships_every_file_type_recursively(tmp_path: Path) -> None:
    write(tmp_path, "train.py", "print('hi')\n")
    write(tmp_path, "data.csv", "a,b\n1,2\n")
    write(tmp_path, "notes.txt", "hello")
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/sub/model.py", "X = 1\n")
    write(tmp_path, "pkg/sub/config.yaml", "k: v\n")
    packed = pack_workdir(tmp_path)
    expected = {
        "train.py",
        "data.csv",
        "notes.txt",
        "pkg/__init__.py",
        "pkg/sub/model.py",
        "pkg/sub/config.yaml",
    }
    assert names(packed) == expected
    assert packed.files == 6
    assert packed.size_bytes == sum((tmp_path / n).stat().st_size for n in expected)
    assert len(packed.sha256) == 64


def test_always_skipped(tmp_path: Path) -> None:
    write(tmp_path, "main.py")
    write(tmp_path, ".git/config")
    write(tmp_path, "__pycache__/main.cpython-311.pyc")
    write(tmp_path, "pkg/__pycache__/m.cpython-311.pyc")
    write(tmp_path, "pkg/stray.pyc")
    write(tmp_path, ".venv/bin/python")
    write(tmp_path, "venv/lib/site.py")
    write(tmp_path, ".ipynb_checkpoints/nb-checkpoint.ipynb")
    write(tmp_path, ".shoal/state.db")
    write(tmp_path, "pkg/venv")  # a *file* named venv is not a virtualenv directory
    assert ".git/" in ALWAYS_SKIPPED
    assert names(pack_workdir(tmp_path)) == {"main.py", "pkg/venv"}


def test_gitignore_root_and_nested(tmp_path: Path) -> None:
    write(tmp_path, ".gitignore", "*.log\nbuild/\n!keep.log\n*.tmp\n")
    write(tmp_path, "main.py")
    write(tmp_path, "run.log")
    write(tmp_path, "keep.log")
    write(tmp_path, "build/out.bin")
    write(tmp_path, "pkg/build/nested.bin")
    write(tmp_path, "x.tmp")
    write(tmp_path, "sub/.gitignore", "secret.txt\n/local.txt\n!important.tmp\n")
    write(tmp_path, "sub/secret.txt")
    write(tmp_path, "sub/deeper/secret.txt")
    write(tmp_path, "sub/local.txt")
    write(tmp_path, "sub/deeper/local.txt")
    write(tmp_path, "sub/important.tmp")
    write(tmp_path, "sub/other.tmp")
    write(tmp_path, "secret.txt")  # the nested .gitignore does not reach up
    write(tmp_path, "local.txt")
    shipped = names(pack_workdir(tmp_path))
    assert shipped == {
        ".gitignore",
        "main.py",
        "keep.log",
        "sub/.gitignore",
        "sub/deeper/local.txt",
        "sub/important.tmp",
        "secret.txt",
        "local.txt",
    }
    everything = names(pack_workdir(tmp_path, use_gitignore=False))
    assert {"run.log", "build/out.bin", "sub/secret.txt", "x.tmp"} <= everything
    assert len(everything) == 16


def test_custom_file_filter_patterns(tmp_path: Path) -> None:
    write(tmp_path, "main.py")
    write(tmp_path, "train.csv")
    write(tmp_path, "pkg/more.csv")
    write(tmp_path, "data/big.bin")
    write(tmp_path, "pkg/data/inner.bin")
    write(tmp_path, "pkg/notes.txt")
    write(tmp_path, "pkg/sub/drop.txt")
    write(tmp_path, "other/sub/keep.txt")
    flt = CustomFileFilter(ignore_name_patterns=["*.csv", "data"])
    assert names(pack_workdir(tmp_path, file_filter=flt)) == {
        "main.py",
        "pkg/notes.txt",
        "pkg/sub/drop.txt",
        "other/sub/keep.txt",
    }
    by_path = CustomFileFilter(ignore_name_patterns=["pkg/sub/*.txt", "data/"])
    assert names(pack_workdir(tmp_path, file_filter=by_path)) == {
        "main.py",
        "train.csv",
        "pkg/more.csv",
        "pkg/notes.txt",
        "other/sub/keep.txt",
    }


def test_callable_filter_like_copytree_ignore(tmp_path: Path) -> None:
    write(tmp_path, "main.py")
    write(tmp_path, "debug.log")
    write(tmp_path, "pkg/inner.log")
    write(tmp_path, "pkg/mod.py")
    write(tmp_path, "scratch/a.py")
    seen: list[str] = []

    def ignore(dirpath: str, entries: list[str]) -> list[str]:
        seen.append(dirpath)
        return [n for n in entries if n.endswith(".log") or n == "scratch"]

    assert names(pack_workdir(tmp_path, file_filter=ignore)) == {"main.py", "pkg/mod.py"}
    assert seen == [str(tmp_path.resolve()), str(tmp_path.resolve() / "pkg")]


def test_bad_filter_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="file_filter"):
        pack_workdir(tmp_path, file_filter=42)


def test_size_limit_names_largest_files_and_fails_before_zipping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = {"a.bin": 100, "b.bin": 600, "c.bin": 500, "d.bin": 400, "e.bin": 300, "f.bin": 200}
    for name, size in sizes.items():
        write(tmp_path, f"blobs/{name}", b"\0" * size)

    def no_zip(_entries: object) -> None:
        raise AssertionError("compressed before checking the limit")

    monkeypatch.setattr(workdir_module, "_zip", no_zip)
    with pytest.raises(InvalidArgumentError) as info:
        pack_workdir(tmp_path, max_bytes=1000)
    msg = str(info.value)
    for name in ("b.bin", "c.bin", "d.bin", "e.bin", "f.bin"):
        assert f"blobs/{name}" in msg
    assert "blobs/a.bin" not in msg
    assert "2.1 KiB" in msg and "1000 B" in msg
    assert "CustomFileFilter(ignore_name_patterns=" in msg and ".gitignore" in msg
    assert info.value.details["max_bytes"] == 1000
    assert info.value.details["size_bytes"] == 2100


def test_deterministic_bytes_and_sha(tmp_path: Path) -> None:
    write(tmp_path, "main.py", "print(1)\n")
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "data.csv", "a,b\n")
    first = pack_workdir(tmp_path)
    second = pack_workdir(tmp_path)  # fresh files are not cached: this zips again
    assert first is not second
    assert first.data == second.data and first.sha256 == second.sha256
    age(tmp_path)  # mtimes are not part of the content identity
    assert pack_workdir(tmp_path).sha256 == first.sha256
    with zipfile.ZipFile(io.BytesIO(first.data)) as zf:
        assert zf.namelist() == sorted(zf.namelist())
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    write(tmp_path, "main.py", "print(2)\n")
    assert pack_workdir(tmp_path).sha256 != first.sha256


def test_cache_returns_same_object_until_files_change(tmp_path: Path) -> None:
    write(tmp_path, "main.py", "print(1)\n")
    write(tmp_path, "data.txt", "abc")
    age(tmp_path)
    first = pack_workdir(tmp_path)
    assert pack_workdir(tmp_path) is first
    flt = CustomFileFilter(ignore_name_patterns=["*.txt"])
    filtered = pack_workdir(tmp_path, file_filter=flt)
    assert filtered is not first and filtered.files == 1
    assert pack_workdir(tmp_path, file_filter=CustomFileFilter(ignore_name_patterns=["*.txt"])) is (
        filtered
    )
    write(tmp_path, "main.py", "print(2)\n")  # same size, new mtime
    os.utime(tmp_path / "main.py", ns=(OLD_NS + 10**9, OLD_NS + 10**9))
    changed = pack_workdir(tmp_path)
    assert changed is not first and changed.sha256 != first.sha256


def test_cache_is_bounded(tmp_path: Path) -> None:
    for i in range(10):
        write(tmp_path / f"d{i}", "main.py")
    age(tmp_path)
    for i in range(10):
        pack_workdir(tmp_path / f"d{i}")
    assert len(workdir_module._cache) == 8


def test_unpack_round_trip_keeps_contents_and_exec_bit(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src, "main.py", "print('hi')\n")
    write(src, "pkg/__init__.py", "")
    write(src, "data/table.csv", "a,b\n1,2\n")
    write(src, "bin/blob.bin", bytes(range(256)))
    script = write(src, "bin/run.sh", "#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    (src / "main.py").chmod(0o600)
    packed = pack_workdir(src)
    dest = tmp_path / "out" / "nested"
    unpack_workdir(packed.data, dest)
    for rel in ("main.py", "pkg/__init__.py", "data/table.csv", "bin/blob.bin", "bin/run.sh"):
        assert (dest / rel).read_bytes() == (src / rel).read_bytes()
    assert (dest / "bin/run.sh").stat().st_mode & stat.S_IXUSR
    assert not (dest / "main.py").stat().st_mode & stat.S_IXUSR
    with zipfile.ZipFile(io.BytesIO(packed.data)) as zf:
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
    assert modes["bin/run.sh"] == 0o755 and modes["main.py"] == 0o644


def test_symlinks_inside_root_ship_as_files_outside_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write(root, "real.txt", "real")
    write(root, "pkg/mod.py", "X = 1\n")
    outside = write(tmp_path, "outside.txt", "secret")
    (root / "alias.txt").symlink_to(root / "real.txt")
    (root / "leak.txt").symlink_to(outside)
    (root / "pkg_link").symlink_to(root / "pkg", target_is_directory=True)
    (root / "dangling").symlink_to(root / "missing")
    packed = pack_workdir(root)
    assert names(packed) == {"real.txt", "alias.txt", "pkg/mod.py"}
    out = tmp_path / "out"
    unpack_workdir(packed.data, out)
    assert (out / "alias.txt").read_text() == "real" and not (out / "alias.txt").is_symlink()


@pytest.mark.parametrize("bad", ["../evil", "/abs", "ok/../../evil"])
def test_unpack_refuses_escaping_entries(tmp_path: Path, bad: str) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("fine.txt", "ok")
        zf.writestr(zipfile.ZipInfo(bad), "pwned")
    target = tmp_path / "target"
    with pytest.raises(InvalidArgumentError, match=repr(bad).replace(".", r"\.")):
        unpack_workdir(buf.getvalue(), target)
    assert not target.exists()  # validated before anything was written
    assert not (tmp_path / "evil").exists()


def test_pack_rejects_a_missing_root(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        pack_workdir(tmp_path / "nope")
