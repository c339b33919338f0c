"""Where a large merged model's prefix is written and read (``shoal.llm._export.store_for``):
through the session's own store when the prefix lies below its root (a team server's store
is then reached over HTTP with the job's token), else through a store opened on the URL."""

from __future__ import annotations

from pathlib import Path

from shoal.llm._export import store_for
from shoal.storage.artifacts import FsspecArtifactStore


def test_a_prefix_below_the_sessions_root_goes_through_the_sessions_store(tmp_path: Path):
    own = FsspecArtifactStore.open(f"file://{tmp_path / 'artifacts'}")
    store, below = store_for(f"{own.root}/job-1/output/model/", own)
    assert store is own and below == "job-1/output/model/"
    store.put_bytes(below + "manifest.json", b"{}")
    assert own.get_bytes("job-1/output/model/manifest.json") == b"{}"


def test_a_prefix_elsewhere_gets_a_store_of_its_own(tmp_path: Path):
    own = FsspecArtifactStore.open(f"file://{tmp_path / 'artifacts'}")
    elsewhere = f"file://{tmp_path / 'artifacts-other' / 'model'}"  # shares the root's start
    store, below = store_for(elsewhere, own)
    assert store is not own and below == ""
    store.put_bytes("manifest.json", b"{}")
    assert (tmp_path / "artifacts-other" / "model" / "manifest.json").read_bytes() == b"{}"
    assert not own.exists("manifest.json")
