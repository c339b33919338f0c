"""Several processes for one job: torchrun variables, gloo on CPU, rank-prefixed output, and
the whole job failed (the other ranks stopped) when one rank fails."""

from __future__ import annotations

import pytest

from helpers import DDP_SCRIPT, rank_lines
from shoal import remote
from shoal.core.jobs import JobStatus
from shoal.errors import InvalidArgumentError
from shoal.pytorch import PyTorch

pytest.importorskip("torch")


def test_torch_distributed_estimator_runs_every_rank_with_gloo(session, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "ddp.py").write_text(DDP_SCRIPT)
    est = PyTorch(entry_point="ddp.py", source_dir=str(src), instance_count=3,
                  distribution={"torch_distributed": {"enabled": True}})
    est.fit(logs=False)
    record = session.jobs.get(est.latest_training_job.name)
    assert record.status == JobStatus.COMPLETED
    ranks = rank_lines(session.jobs.read_log(record.name).decode())
    assert set(ranks) == {"[algo-1 rank 0]", "[algo-2 rank 1]", "[algo-3 rank 2]"}
    for label, seen in ranks.items():
        assert seen["world"] == 3 and seen["sum"] == 6.0  # 1 + 2 + 3 across the ranks
        assert seen["host"] == label[1:7] and seen["local_rank"] == "0"
        assert seen["hosts"] == ["algo-1", "algo-2", "algo-3"]
    assert len({s["master"] for s in ranks.values()}) == 1


def _one(x: float) -> float:
    return x


def test_remote_multi_instance_needs_torchrun(session):
    with pytest.raises(InvalidArgumentError, match="needs use_torchrun=True"):
        remote(instance_count=2)(_one)
    with pytest.raises(InvalidArgumentError, match="nproc_per_node must be a positive integer"):
        remote(use_torchrun=True, nproc_per_node=0)(_one)
