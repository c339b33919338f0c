"""Issue #22 item 2: ``CheckpointLocation`` as SageMaker's remote-function examples use it: the
function receives a local directory that starts with the stored checkpoints and is uploaded
when the function ends, so the next job resumes from it."""

from __future__ import annotations

import os

from shoal.remote_function import CheckpointLocation, RemoteOptions, remote


def test_a_remote_function_resumes_from_its_checkpoints(session, tmp_path):
    checkpoints = (tmp_path / "bucket" / "checkpoints").as_uri()

    @remote(instance_type="ml.m5.large")
    def train(epochs: int, checkpoint_path: CheckpointLocation) -> tuple[int, str]:
        state = os.path.join(checkpoint_path, "epoch.txt")
        start = int(open(state).read()) if os.path.exists(state) else 0
        for _ in range(epochs):
            start += 1
        with open(state, "w") as f:
            f.write(str(start))
        return start, os.fspath(checkpoint_path)

    first, local = train(2, CheckpointLocation(checkpoints))
    assert first == 2 and local != str(tmp_path / "bucket" / "checkpoints")  # a job-local dir
    assert (tmp_path / "bucket" / "checkpoints" / "epoch.txt").read_text() == "2"
    second, _ = train(3, CheckpointLocation(checkpoints))
    assert second == 5  # started from the uploaded checkpoint
    spec, _ = RemoteOptions().build_job(train.__wrapped__, session,
                                        call_args=(1, CheckpointLocation(checkpoints)))
    assert spec.extra["checkpoint_s3_uri"] == checkpoints  # on the record, like CheckpointConfig
