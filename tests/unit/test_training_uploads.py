"""What a job submitted through a team server reads from the client's disk: the files of a
local path, as keys below the job, and the progress of their upload past a few MB."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.errors import InvalidArgumentError
from shoal.training._inputs import PROGRESS_BYTES, UploadProgress, local_files


def test_a_directory_is_its_files_below_the_channel_and_a_file_is_itself(tmp_path: Path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "x.txt").write_text("x")
    (tmp_path / "d" / "sub" / "y.txt").write_text("y")
    where, files = local_files(tmp_path / "d", "input/data/train", "channel 'train'")
    assert where == "input/data/train"
    assert files == {"input/data/train/x.txt": tmp_path / "d" / "x.txt",
                     "input/data/train/sub/y.txt": tmp_path / "d" / "sub" / "y.txt"}
    where, files = local_files(tmp_path / "d" / "x.txt", "input/data/one", "channel 'one'")
    assert where == "input/data/one/x.txt" and files == {where: tmp_path / "d" / "x.txt"}


def test_an_empty_or_missing_path_is_refused_naming_it(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgumentError, match="channel 'train'.*holds no files"):
        local_files(tmp_path / "empty", "input/data/train", "channel 'train'")
    with pytest.raises(InvalidArgumentError, match="base_model.*does not exist") as info:
        local_files(tmp_path / "gone", "input/base_model", "base_model")
    assert info.value.details["path"] == str(tmp_path / "gone")


def test_progress_is_shown_past_the_threshold_only():
    lines: list[str] = []
    chunk = b"\0" * (PROGRESS_BYTES // 8)
    files: dict[str, bytes | Path] = {f"input/data/t/{i}.bin": chunk for i in range(9)}
    progress = UploadProgress("job-1", files, write=lines.append)
    for rel, data in files.items():
        progress(rel, len(data))  # type: ignore[arg-type]
    assert len(lines) == 9 and all("job job-1: uploaded" in line for line in lines)
    total = 9 * len(chunk) / 1e6
    assert lines[-1].startswith(f"[shoal] job job-1: uploaded {total:.1f} of {total:.1f} MB")

    quiet: list[str] = []
    small = UploadProgress("job-2", {"a": b"tiny"}, write=quiet.append)
    small("a", 4)
    assert quiet == []
