"""Script-mode training jobs: the SageMaker container contract, outputs, metrics, checkpoints.

Every test runs a real training script in a real job process under a detached supervisor.
"""

from __future__ import annotations

import io
import json
import tarfile
import textwrap
from pathlib import Path

import pytest

from shoal.core.experiments import job_owner
from shoal.core.jobs import JobStatus
from shoal.core.ports import JobQuery
from shoal.errors import InvalidArgumentError, JobFailedError
from shoal.estimator import Estimator
from shoal.inputs import TrainingInput
from shoal.storage.artifacts import FsspecArtifactStore

CONTRACT_SCRIPT = """
import argparse, json, os, sys
p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int)
p.add_argument("--lr", type=float)
p.add_argument("--name")
p.add_argument("--flags")
args = p.parse_args()
env = {k: v for k, v in os.environ.items() if k.startswith("SM_")}
cfg = os.path.join(os.environ["SM_INPUT_CONFIG_DIR"])
seen = {
    "argv": sys.argv[1:],
    "args": vars(args),
    "env": env,
    "hyperparameters.json": json.load(open(os.path.join(cfg, "hyperparameters.json"))),
    "inputdataconfig.json": json.load(open(os.path.join(cfg, "inputdataconfig.json"))),
    "resourceconfig.json": json.load(open(os.path.join(cfg, "resourceconfig.json"))),
    "train_files": sorted(os.listdir(os.environ["SM_CHANNEL_TRAINING"])),
    "test_files": sorted(os.listdir(os.environ["SM_CHANNEL_TESTING"])),
    "cwd_has_helper": os.path.exists("helper.py"),
}
import helper
seen["helper"] = helper.VALUE
os.makedirs(os.path.join(os.environ["SM_MODEL_DIR"], "sub"), exist_ok=True)
open(os.path.join(os.environ["SM_MODEL_DIR"], "seen.json"), "w").write(json.dumps(seen))
open(os.path.join(os.environ["SM_MODEL_DIR"], "sub", "weights.bin"), "wb").write(b"w" * 10)
open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "report.txt"), "w").write("report")
for epoch in range(args.epochs):
    print(f"epoch={epoch} train_loss={1.0 / (epoch + 1):.4f}", flush=True)
print("test_accuracy: 0.93")
"""


def _members(uri: str) -> dict[str, bytes]:
    store = FsspecArtifactStore.open(uri.rsplit("/", 1)[0])
    data = store.get_bytes(uri.rsplit("/", 1)[1])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(CONTRACT_SCRIPT)
    (src / "helper.py").write_text("VALUE = 'from source_dir'\n")
    for channel, files in (("train", ("a.csv", "b.csv")), ("test", ("c.csv",))):
        d = tmp_path / "data" / channel
        d.mkdir(parents=True)
        for f in files:
            (d / f).write_text("1,2\n")
    return tmp_path


def test_fit_runs_an_unmodified_sagemaker_script(session, project):
    est = Estimator(entry_point="train.py", source_dir=str(project / "src"),
                    hyperparameters={"epochs": 3, "lr": 0.05, "name": "cnn",
                                     "flags": {"a": [1, 2]}},
                    metric_definitions=[{"Name": "train:loss", "Regex": r"train_loss=([0-9.]+)"},
                                        {"Name": "test:acc", "Regex": r"test_accuracy: ([0-9.]+)"}],
                    base_job_name="contract", tags=[{"Key": "team", "Value": "ml"}])
    est.fit({"training": str(project / "data" / "train"),
             "testing": TrainingInput(f"file://{project / 'data' / 'test'}",
                                      content_type="text/csv")}, logs=False)
    job = est.latest_training_job
    assert job.name.startswith("contract-")
    record = session.jobs.get(job.name)
    assert record.status == JobStatus.COMPLETED
    # The model: <output_path>/<job>/output/model.tar.gz, with model/ as it was written.
    assert est.model_data == session.artifacts.uri(f"{job.name}/output/model.tar.gz")
    model = _members(est.model_data)
    assert model["sub/weights.bin"] == b"w" * 10
    assert _members(session.artifacts.uri(f"{job.name}/output/output.tar.gz")) == {
        "report.txt": b"report"}
    assert session.artifacts.exists(f"{job.name}/source/sourcedir.tar.gz")
    seen = json.loads(model["seen.json"])
    # Hyperparameters as sorted --key value; non-strings JSON-encoded.
    assert seen["argv"] == ["--epochs", "3", "--flags", '{"a": [1, 2]}', "--lr", "0.05",
                            "--name", "cnn"]
    assert seen["args"]["epochs"] == 3 and seen["args"]["name"] == "cnn"
    assert seen["hyperparameters.json"] == {"epochs": "3", "flags": '{"a": [1, 2]}',
                                            "lr": "0.05", "name": "cnn"}
    assert seen["inputdataconfig.json"]["testing"]["ContentType"] == "text/csv"
    assert seen["inputdataconfig.json"]["training"]["TrainingInputMode"] == "File"
    assert seen["resourceconfig.json"]["hosts"] == ["algo-1"]
    assert seen["train_files"] == ["a.csv", "b.csv"] and seen["test_files"] == ["c.csv"]
    assert seen["helper"] == "from source_dir" and seen["cwd_has_helper"]
    env = seen["env"]
    assert json.loads(env["SM_CHANNELS"]) == ["testing", "training"]
    assert json.loads(env["SM_HPS"])["epochs"] == 3
    assert env["SM_HP_EPOCHS"] == "3" and env["SM_HP_NAME"] == "cnn"
    assert json.loads(env["SM_HOSTS"]) == ["algo-1"] and env["SM_CURRENT_HOST"] == "algo-1"
    for var in ("SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR", "SM_NUM_CPUS", "SM_NUM_GPUS",
                "SM_TRAINING_ENV", "SM_CHANNEL_TRAINING", "SM_CHANNEL_TESTING", "SM_MODULE_DIR",
                "SM_USER_ENTRY_POINT", "SM_INPUT_DATA_CONFIG", "SM_RESOURCE_CONFIG"):
        assert env[var], var
    assert json.loads(env["SM_TRAINING_ENV"])["channel_input_dirs"]["training"] == \
        env["SM_CHANNEL_TRAINING"]
    # Metrics: each series with timestamps, from the output as it streamed.
    points = session.metadata.get_metrics(job_owner(job.name))
    assert [p.value for p in points if p.name == "train:loss"] == [1.0, 0.5, 0.3333]
    assert [p.value for p in points if p.name == "test:acc"] == [0.93]
    assert all(p.timestamp > 0 for p in points)
    desc = job.describe()
    assert desc["TrainingJobStatus"] == "Completed"
    assert desc["ModelArtifacts"]["S3ModelArtifacts"] == est.model_data
    assert {m["MetricName"]: m["Value"] for m in desc["FinalMetricDataList"]} == {
        "train:loss": 0.3333, "test:acc": 0.93}
    assert desc["Tags"] == [{"Key": "team", "Value": "ml"}]


def test_entry_point_alone_output_path_and_attach(session, tmp_path):
    script = tmp_path / "solo.py"
    script.write_text("import os\nopen(os.path.join(os.environ['SM_MODEL_DIR'], 'm.txt'), 'w')"
                      ".write('solo')\nprint('done')\n")
    out = tmp_path / "models"
    est = Estimator(entry_point=str(script), output_path=out.as_uri())
    est.fit(job_name="solo-job-1", logs=False)
    assert est.model_data == f"{out.as_uri()}/solo-job-1/output/model.tar.gz"
    assert _members(est.model_data) == {"m.txt": b"solo"}
    again = Estimator.attach("solo-job-1")
    assert again.model_data == est.model_data
    assert again.latest_training_job.describe()["TrainingJobStatus"] == "Completed"
    from shoal import remote

    @remote
    def plain():
        return 1

    assert plain() == 1
    [fn_job] = [r for r in session.metadata.list_jobs(JobQuery()) if r.name != "solo-job-1"]
    with pytest.raises(InvalidArgumentError, match="not a training job"):
        Estimator.attach(fn_job.name)


def test_failing_script_reports_exit_code_and_last_output(session, tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("print('loading data')\nprint('about to fail')\nraise SystemExit(3)\n")
    est = Estimator(entry_point=str(script))
    with pytest.raises(JobFailedError) as info:
        est.fit(logs=False)
    record = session.jobs.get(est.latest_training_job.name)
    assert record.status == JobStatus.FAILED and record.exit_code == 3
    assert "exited with code 3" in record.failure_reason
    assert "about to fail" in record.failure_reason
    assert est.latest_training_job.name in str(info.value)
    with pytest.raises(InvalidArgumentError, match="model_data exists once"):
        _ = est.model_data
    assert not session.artifacts.exists(f"{record.name}/output/model.tar.gz")


def test_output_failure_file_becomes_the_reason(session, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        open(os.path.join(os.environ["SM_OUTPUT_DIR"], "failure"), "w").write(
            "ValueError: the training channel has no rows")
        sys.exit(1)
    """))
    est = Estimator(entry_point=str(script))
    with pytest.raises(JobFailedError, match="the training channel has no rows"):
        est.fit(logs=False)
    record = session.jobs.get(est.latest_training_job.name)
    assert record.failure_reason.startswith("AlgorithmError: ValueError: the training channel")


def test_checkpoints_resume_a_retried_job(session, tmp_path):
    """A job killed mid-run (a signal shoal did not send) is retried and resumes from the
    checkpoints synced to checkpoint_s3_uri."""
    script = tmp_path / "ckpt.py"
    script.write_text(textwrap.dedent("""
        import os, signal
        ckpt = "/opt/ml/checkpoints"
        local = os.environ["SM_CHECKPOINT_DIR"]
        path = os.path.join(local, "epoch.txt")
        start = int(open(path).read()) + 1 if os.path.exists(path) else 0
        print(f"starting at epoch {start}", flush=True)
        for epoch in range(start, 4):
            with open(path + ".tmp", "w") as f:
                f.write(str(epoch))
            os.replace(path + ".tmp", path)
            print(f"epoch {epoch} done", flush=True)
            if epoch == 1 and start == 0:
                os.kill(os.getpid(), signal.SIGKILL)  # an interruption, as a spot reclaim
        open(os.path.join(os.environ["SM_MODEL_DIR"], "resumed_from.txt"), "w").write(str(start))
    """))
    ckpt_uri = (tmp_path / "ckpts").as_uri()
    est = Estimator(entry_point=str(script), max_retry_attempts=2, checkpoint_s3_uri=ckpt_uri)
    est.fit(logs=False)
    assert _members(est.model_data) == {"resumed_from.txt": b"2"}
    record = session.jobs.get(est.latest_training_job.name)
    assert record.attempt == 2
    assert (tmp_path / "ckpts" / "epoch.txt").read_text() == "3"
    log = session.jobs.read_log(record.name).decode()
    assert "starting at epoch 0" in log and "starting at epoch 2" in log
    assert "restored 1 checkpoint file(s)" in log


@pytest.mark.s3
def test_s3_channels_are_copied_and_a_missing_one_fails_early(session, tmp_path,
                                                               s3_bucket_url, moto_server,
                                                               monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_server)
    url, options = s3_bucket_url
    data = tmp_path / "d"
    (data / "nested").mkdir(parents=True)
    (data / "x.csv").write_text("1\n")
    (data / "nested" / "y.csv").write_text("2\n")
    uri = session.upload_data(str(data), bucket=url, key_prefix="datasets/digits")
    assert uri == f"{url}/datasets/digits"
    one = session.upload_data(str(data / "x.csv"), bucket=url, key_prefix="single")
    assert one == f"{url}/single/x.csv"
    script = tmp_path / "ls.py"
    script.write_text("import os\nfor root, _, files in os.walk(os.environ['SM_CHANNEL_TRAINING']):"
                      "\n    for f in files: print('file', os.path.relpath(os.path.join(root, f),"
                      " os.environ['SM_CHANNEL_TRAINING']), open(os.path.join(root, f)).read()"
                      ".strip())\n")
    est = Estimator(entry_point=str(script))
    est.fit({"training": uri}, logs=False)
    log = session.jobs.read_log(est.latest_training_job.name).decode()
    assert "file x.csv 1" in log and "file nested/y.csv 2" in log
    assert "channel training: copied 2 file(s)" in log
    jobs_before = len(session.metadata.list_jobs(JobQuery()))
    with pytest.raises(InvalidArgumentError, match="channel 'validation'.*does not exist"):
        est.fit({"training": uri, "validation": f"{url}/no/such/prefix"})
    with pytest.raises(InvalidArgumentError, match="channel 'training'.*does not exist"):
        est.fit({"training": str(tmp_path / "missing")})
    assert len(session.metadata.list_jobs(JobQuery())) == jobs_before


def test_bad_estimator_arguments_fail_when_built(session, tmp_path):
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    with pytest.raises(InvalidArgumentError, match="entry_point is required"):
        Estimator()
    with pytest.raises(InvalidArgumentError, match="entry_point .*does not exist"):
        Estimator(entry_point=str(tmp_path / "nope.py"))
    with pytest.raises(InvalidArgumentError, match="source_dir .* is not a directory"):
        Estimator(entry_point="t.py", source_dir=str(tmp_path / "nodir"))
    with pytest.raises(InvalidArgumentError, match="entry_point t2.py is not in source_dir"):
        Estimator(entry_point="t2.py", source_dir=str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="metric 'loss': regex .* does not compile"):
        Estimator(entry_point=str(script), metric_definitions=[{"Name": "loss",
                                                                "Regex": "loss=([0-9"}])
    with pytest.raises(InvalidArgumentError, match="needs a capture group"):
        Estimator(entry_point=str(script), metric_definitions=[{"Name": "loss",
                                                                "Regex": "loss=[0-9]+"}])
    for bad in ("learning rate", "-lr", "", "x=y"):
        with pytest.raises(InvalidArgumentError, match="cannot be a command-line flag"):
            Estimator(entry_point=str(script), hyperparameters={bad: 1})
    with pytest.raises(InvalidArgumentError, match="job_name"):
        Estimator(entry_point=str(script)).fit(job_name="bad name!")
    with pytest.raises(TypeError, match="epochs"):
        Estimator(entry_point=str(script), epochs=3)


def test_training_inside_a_run_is_linked_and_load_run_finds_it(session, tmp_path):
    from shoal.core.experiments import run_owner
    from shoal.experiments.run import Run

    script = tmp_path / "tracked.py"
    script.write_text(textwrap.dedent("""
        from shoal.experiments.run import load_run
        with load_run() as run:
            run.log_parameter("batch_size", 32)
            for step in range(3):
                run.log_metric("script:loss", 1.0 / (step + 1), step=step)
        print("val_acc=0.75")
    """))
    with Run(experiment_name="digits", run_name="cnn-1") as run:
        run.log_parameter("optimizer", "adam")
        est = Estimator(entry_point=str(script),
                        metric_definitions=[{"Name": "val:acc", "Regex": r"val_acc=([0-9.]+)"}])
        est.fit(logs=False)
    name = est.latest_training_job.name
    record = session.metadata.get_run("digits", "cnn-1")
    assert name in record.jobs
    assert record.parameters == {"optimizer": "adam", "batch_size": 32}
    points = session.metadata.get_metrics(run_owner("digits", "cnn-1"))
    assert [(p.value, p.step) for p in points if p.name == "script:loss"] == [
        (1.0, 0), (0.5, 1), (1 / 3, 2)]
    assert [p.value for p in points if p.name == "val:acc"] == [0.75]
    desc = est.latest_training_job.describe()
    assert desc["ExperimentConfig"] == {"ExperimentName": "digits", "RunName": "cnn-1"}


def test_local_instance_keeps_the_callers_thread_limits(session, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    script = tmp_path / "threads.py"
    script.write_text("import os\nprint('threads', os.environ['OMP_NUM_THREADS'], "
                      "os.environ['MKL_NUM_THREADS'])\n")
    est = Estimator(entry_point=str(script))  # instance_type "local": this machine, as is
    est.fit(logs=False)
    assert "threads 1 1" in session.jobs.read_log(est.latest_training_job.name).decode()
