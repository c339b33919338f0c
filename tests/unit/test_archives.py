"""The one safe-extract helper (shoal._internal.archives): caps on size and file count checked
while extracting, unsafe members refused, and nothing left behind when it stops.

Every archive is a real tar or zip built here; the bombs are zeros, which compress ~1000:1.
"""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from shoal._internal.archives import ExtractLimits, extract_tar, extract_zip
from shoal.config import Settings
from shoal.errors import ConfigError, InvalidArgumentError, StorageError

MIB = 2**20
SMALL = ExtractLimits(max_bytes=1 * MIB, max_files=10)


def _zeros_tar(path: Path, sizes: dict[str, int], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, size in sizes.items():
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    return path


def _nothing_left(parent: Path, target: Path) -> None:
    assert not target.exists()
    assert not [p.name for p in parent.iterdir() if "extracting" in p.name]


def test_a_tar_bomb_stops_at_the_byte_cap_and_leaves_nothing(tmp_path: Path) -> None:
    archive = _zeros_tar(tmp_path / "model.tar.gz", {"weights.bin": 64 * MIB})
    assert archive.stat().st_size < 200_000  # 64 MiB of zeros in well under 200 kB
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InvalidArgumentError) as info:
        extract_tar(archive, out / "model", limits=SMALL)
    text = str(info.value)
    assert str(archive) in text and "1.0 MiB" in text and str(MIB) in text
    assert "SHOAL_MAX_EXTRACT_BYTES" in text and "max_extract_bytes" in text
    assert info.value.details["limit"] == MIB
    _nothing_left(out, out / "model")


def test_the_byte_cap_is_checked_while_streaming_not_after_reading_the_whole_archive(
        tmp_path: Path) -> None:
    # A bomb whose tail is cut off: reading every member first would fail on the truncated
    # stream; extracting member by member reaches the cap on the first one and stops there.
    whole = _zeros_tar(tmp_path / "whole.tar.gz", {"a.bin": 8 * MIB, "b.bin": 8 * MIB})
    data = whole.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) * 3 // 4])
    with pytest.raises(InvalidArgumentError, match="expands to more than"):
        extract_tar(cut, tmp_path / "x", limits=SMALL)
    _nothing_left(tmp_path, tmp_path / "x")
    # Without a cap in the way, the same archive is reported as the broken stream it is.
    with pytest.raises(InvalidArgumentError, match="not a readable tar archive"):
        extract_tar(cut, tmp_path / "y", limits=ExtractLimits())
    _nothing_left(tmp_path, tmp_path / "y")


def test_many_small_members_add_up_to_the_byte_cap(tmp_path: Path) -> None:
    archive = _zeros_tar(tmp_path / "m.tar.gz", {f"f{i}": 300_000 for i in range(5)})
    with pytest.raises(InvalidArgumentError, match=r"stopped after 4 member\(s\)"):
        extract_tar(archive, tmp_path / "t", limits=SMALL)
    _nothing_left(tmp_path, tmp_path / "t")


def test_too_many_files_in_a_tar_stop_at_the_file_cap(tmp_path: Path) -> None:
    archive = _zeros_tar(tmp_path / "many.tar", {f"d/f{i}.txt": 0 for i in range(50)}, "w")
    with pytest.raises(InvalidArgumentError) as info:
        extract_tar(archive, tmp_path / "t", limits=SMALL)
    text = str(info.value)
    assert str(archive) in text and "more than 10 files" in text
    assert "SHOAL_MAX_EXTRACT_FILES" in text and "max_extract_files" in text
    _nothing_left(tmp_path, tmp_path / "t")


def test_a_zip_bomb_and_a_zip_of_too_many_files_leave_nothing(tmp_path: Path) -> None:
    bomb = tmp_path / "bundle.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model/model.onnx", bytes(32 * MIB))
    assert bomb.stat().st_size < 100_000
    with pytest.raises(InvalidArgumentError, match="SHOAL_MAX_EXTRACT_BYTES") as info:
        extract_zip(bomb, tmp_path / "t", limits=SMALL)
    assert str(bomb) in str(info.value)
    _nothing_left(tmp_path, tmp_path / "t")
    many = io.BytesIO()
    with zipfile.ZipFile(many, "w") as zf:
        for i in range(11):
            zf.writestr(f"f{i}", b"x")
    with pytest.raises(InvalidArgumentError, match="more than 10 files"):
        extract_zip(io.BytesIO(many.getvalue()), tmp_path / "u", limits=SMALL, label="the zip u")
    _nothing_left(tmp_path, tmp_path / "u")


def test_within_the_caps_everything_lands_with_its_modes(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, data, mode in (("code/run.sh", b"#!/bin/sh\n", 0o755), ("w.bin", bytes(1000),
                                                                          0o644)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("code/alias.sh")
        link.type, link.linkname = tarfile.SYMTYPE, "run.sh"
        tar.addfile(link)
    target = tmp_path / "t"
    target.mkdir()  # an empty directory is filled in place
    extract_tar(archive, target, limits=SMALL)
    assert (target / "w.bin").read_bytes() == bytes(1000)
    assert os.access(target / "code" / "run.sh", os.X_OK)
    assert (target / "code" / "alias.sh").resolve() == (target / "code" / "run.sh").resolve()
    # Into a directory that holds something: what the archive holds replaces it, the rest stays.
    (target / "w.bin").write_bytes(b"old")
    (target / "keep.txt").write_text("mine")
    extract_tar(archive, target, limits=SMALL)
    assert (target / "w.bin").read_bytes() == bytes(1000)
    assert (target / "keep.txt").read_text() == "mine"
    _nothing_left(tmp_path, tmp_path / "absent")


def test_an_absolute_member_lands_inside_the_target(tmp_path: Path) -> None:
    archive = tmp_path / "abs.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo(str(tmp_path / "abs.txt"))
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
    extract_tar(archive, tmp_path / "t", limits=SMALL)  # the "data" filter strips the "/"
    assert not (tmp_path / "abs.txt").exists()
    assert (tmp_path / "t" / str(tmp_path).lstrip("/") / "abs.txt").read_bytes() == b"ok"


@pytest.mark.parametrize("kind", ["dotdot", "symlink-out", "hardlink-out", "device"])
def test_members_that_would_escape_are_refused_and_nothing_is_written(tmp_path: Path,
                                                                      kind: str) -> None:
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        fine = tarfile.TarInfo("fine.txt")
        fine.size = 2
        tar.addfile(fine, io.BytesIO(b"ok"))
        info = tarfile.TarInfo("../escaped.txt" if kind == "dotdot" else "bad")
        if kind == "symlink-out":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif kind == "hardlink-out":
            info.type, info.linkname = tarfile.LNKTYPE, "../../etc/passwd"
        elif kind == "device":
            info.type = tarfile.CHRTYPE
        tar.addfile(info, io.BytesIO(b""))
    target = tmp_path / "d" / "t"
    with pytest.raises(InvalidArgumentError, match="refusing to extract"):
        extract_tar(archive, target, limits=SMALL)
    _nothing_left(target.parent, target)
    assert not (tmp_path / "d" / "escaped.txt").exists()


@pytest.mark.parametrize("bad", ["../evil", "/abs", "ok/../../evil", "C:/win"])
def test_zip_entries_that_would_escape_are_refused_before_anything_is_written(
        tmp_path: Path, bad: str) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("fine.txt", "ok")
        zf.writestr(zipfile.ZipInfo(bad), "pwned")
    with pytest.raises(InvalidArgumentError, match="refusing to extract"):
        extract_zip(io.BytesIO(buf.getvalue()), tmp_path / "t", limits=SMALL)
    _nothing_left(tmp_path, tmp_path / "t")


def test_a_file_that_is_no_archive_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "model.tar.gz"
    junk.write_bytes(b"not an archive at all" * 10)
    with pytest.raises(InvalidArgumentError, match=f"{junk}.*not a readable tar archive"):
        extract_tar(junk, tmp_path / "t", limits=SMALL)
    with pytest.raises(InvalidArgumentError, match=f"{junk}.*not a readable zip archive"):
        extract_zip(junk, tmp_path / "u", limits=SMALL)
    with pytest.raises(StorageError, match="cannot extract"):
        extract_tar(tmp_path / "missing.tar", tmp_path / "v", limits=SMALL)
    for name in ("t", "u", "v"):
        _nothing_left(tmp_path, tmp_path / name)


def test_the_caps_come_from_settings_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    default = ExtractLimits()
    assert default.max_bytes == 20 * 2**30 and default.max_files == 100_000
    monkeypatch.setenv("SHOAL_MAX_EXTRACT_BYTES", "5_000")
    monkeypatch.setenv("SHOAL_MAX_EXTRACT_FILES", "7")
    assert ExtractLimits.from_environ() == ExtractLimits(5000, 7)
    settings = Settings()
    assert ExtractLimits.from_settings(settings) == ExtractLimits(5000, 7)
    assert ExtractLimits.from_settings(Settings(max_extract_bytes=9)).max_bytes == 9
    with pytest.raises(ConfigError, match="max_extract_files"):
        Settings(max_extract_files=0)
    monkeypatch.setenv("SHOAL_MAX_EXTRACT_BYTES", "lots")
    with pytest.raises(ConfigError, match="SHOAL_MAX_EXTRACT_BYTES='lots'"):
        ExtractLimits.from_environ()


def test_the_session_hands_its_caps_to_the_supervisors(tmp_path: Path) -> None:
    import shoal

    session = shoal.Session(home=str(tmp_path / "home"), max_extract_bytes=12345,
                            max_extract_files=67)
    try:
        env = session.supervisor_env()
    finally:
        session.close()
    assert ExtractLimits.from_environ(env) == ExtractLimits(12345, 67)


def test_a_full_disk_stops_the_extraction_naming_the_archive_and_leaves_nothing(
        tmp_path: Path) -> None:
    from helpers import small_tmpfs

    archive = _zeros_tar(tmp_path / "big.tar.gz", {"weights.bin": 4 * MIB})
    with small_tmpfs(tmp_path / "disk", size="1m") as disk:
        with pytest.raises(StorageError) as info:
            extract_tar(archive, disk / "model", limits=ExtractLimits())
        assert str(archive) in str(info.value) and "disk is full" in str(info.value)
        assert list(disk.iterdir()) == []


def test_the_model_server_and_the_workdir_use_the_caps_of_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.envs.workdir import unpack_workdir
    from shoal.errors import ModelLoadError
    from shoal.serving.artifact import resolve_model

    monkeypatch.setenv("SHOAL_MAX_EXTRACT_BYTES", str(MIB))
    monkeypatch.setenv("SHOAL_MAX_EXTRACT_FILES", "5")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    bomb = _zeros_tar(tmp_path / "model.tar.gz", {"model.onnx": 16 * MIB})
    with pytest.raises(ModelLoadError, match=f"{bomb}.*SHOAL_MAX_EXTRACT_BYTES"):
        resolve_model(bomb)
    assert list((tmp_path / "tmp").iterdir()) == []  # the server's private copy is gone too
    many = io.BytesIO()
    with zipfile.ZipFile(many, "w") as zf:
        for i in range(6):
            zf.writestr(f"pkg/m{i}.py", "")
    with pytest.raises(InvalidArgumentError, match="workdir archive.*more than 5 files"):
        unpack_workdir(many.getvalue(), tmp_path / "src")
    _nothing_left(tmp_path, tmp_path / "src")
