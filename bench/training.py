"""shoal's overhead around a training script: ``Estimator.fit`` vs the same ``train.py`` run
directly with the same ``SM_*`` variables.

    .venv/bin/python bench/training.py [--runs 7] [--mb 8] [--no-s3]

Target (issue #4): at most 1 s more than the direct run, plus the time to copy the inputs.

- **direct** (anchor): ``subprocess.run([python, "train.py", --hyperparameters], env=SM_*)``
  against a prepared ``/opt/ml``-style directory whose ``training`` channel is the data.
- **shoal, local channel**: ``Estimator(entry_point="train.py", source_dir=...,
  hyperparameters=..., metric_definitions=...).fit({"training": <dir>})`` with the same data
  directory, which the job links (no copy), to its end: source packed and stored, a durable
  job record, the supervisor, the container layout, the script, metrics parsed from its
  output, ``model.tar.gz`` and ``output.tar.gz`` uploaded.
- **shoal, s3:// channel** (moto's S3 server, when ``moto[server]`` and boto3 are installed):
  the same with the data uploaded to a bucket first, so the job copies it in; the copy time is
  read from the job's log and reported beside the overhead.

The script reads every file of its channel, prints a loss per "epoch" (the metric
definitions), and writes a 1 MB model file. Each side runs once unmeasured first (the shoal
side starts its launcher then), then ``--runs`` times; medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import cpu_model, scratch, stop_background

TRAIN_PY = '''\
import argparse, os, pathlib, time

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--model-dir", default=os.environ["SM_MODEL_DIR"])
p.add_argument("--train", default=os.environ["SM_CHANNEL_TRAINING"])
args = p.parse_args()
total = sum(len(f.read_bytes()) for f in sorted(pathlib.Path(args.train).rglob("*"))
            if f.is_file())
for epoch in range(1, args.epochs + 1):
    print(f"epoch {epoch}: loss={args.lr / epoch:.4f} bytes={total}", flush=True)
(pathlib.Path(args.model_dir) / "model.bin").write_bytes(os.urandom(1 << 20))
'''
HYPERPARAMETERS = {"epochs": 3, "lr": 0.1}
METRICS = [{"Name": "train:loss", "Regex": r"loss=([0-9.]+)"}]




def _prepare(root: Path, mb: int) -> tuple[Path, Path]:
    src = root / "src"
    src.mkdir()
    (src / "train.py").write_text(TRAIN_PY)
    data = root / "data" / "training"
    data.mkdir(parents=True)
    for i in range(max(1, mb)):
        (data / f"part-{i:03d}.bin").write_bytes(os.urandom(1 << 20))
    return src, data


def _sm_env(base: Path, data: Path) -> dict[str, str]:
    """The SM_* variables a job gets (shoal/jobs/_training.py), for a directory of our own."""
    hps = HYPERPARAMETERS
    env = {"SM_MODEL_DIR": str(base / "model"), "SM_OUTPUT_DIR": str(base / "output"),
           "SM_OUTPUT_DATA_DIR": str(base / "output" / "data"),
           "SM_INPUT_DIR": str(base / "input"),
           "SM_INPUT_CONFIG_DIR": str(base / "input" / "config"),
           "SM_CHANNEL_TRAINING": str(base / "input" / "data" / "training"),
           "SM_CHANNELS": json.dumps(["training"]), "SM_HPS": json.dumps(hps, sort_keys=True),
           "SM_NUM_CPUS": str(os.cpu_count() or 1), "SM_NUM_GPUS": "0",
           "SM_HOSTS": json.dumps(["algo-1"]), "SM_CURRENT_HOST": "algo-1",
           "SM_MODULE_NAME": "train", "SM_USER_ENTRY_POINT": "train.py"}
    env.update({f"SM_HP_{k.upper()}": json.dumps(v) for k, v in hps.items()})
    (base / "input" / "data").mkdir(parents=True, exist_ok=True)
    (base / "input" / "data" / "training").symlink_to(data, target_is_directory=True)
    return env


def direct_seconds(src: Path, data: Path, root: Path, runs: int) -> list[float]:
    args = [a for k, v in sorted(HYPERPARAMETERS.items()) for a in (f"--{k}", json.dumps(v))]
    times = []
    for i in range(runs + 1):
        base = root / f"direct-{i}"
        env = {**os.environ, **_sm_env(base, data)}
        t = time.perf_counter()
        for d in ("model", "output/data"):  # what the layout step makes
            (base / d).mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "train.py", *args], cwd=src, env=env,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        elapsed = time.perf_counter() - t
        if proc.returncode != 0:
            raise RuntimeError(proc.stdout + proc.stderr)
        if i:
            times.append(elapsed)
    return times


def shoal_seconds(session, src: Path, channel: str, runs: int) -> tuple[list[float], list[str]]:
    from shoal.estimator import Estimator

    est = Estimator(entry_point="train.py", source_dir=str(src), sagemaker_session=session,
                    hyperparameters=HYPERPARAMETERS, metric_definitions=METRICS)
    times, names = [], []
    for i in range(runs + 1):
        t = time.perf_counter()
        est.fit({"training": channel}, logs=False)
        elapsed = time.perf_counter() - t
        job = est.latest_training_job
        final = job.describe()["FinalMetricDataList"]
        if [m["MetricName"] for m in final] != ["train:loss"]:
            raise RuntimeError(f"job {job.name} has metrics {final}")
        if i:
            times.append(elapsed)
            names.append(job.name)
    return times, names


def _copy_seconds(session, names: list[str]) -> list[float]:
    """The job's own account of staging the channel: 'channel training: copied ... in T s'."""
    out = []
    for name in names:
        log = session.jobs.read_log(name).decode()
        m = re.search(r"channel training: copied .* in ([0-9.]+) s", log)
        if m is None:
            raise RuntimeError(f"job {name} did not copy its channel:\n{log}")
        out.append(float(m.group(1)))
    return out


def _moto(root: Path) -> tuple[subprocess.Popen[bytes], str] | None:
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with open(root / "moto.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                 str(port)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"moto server did not start: {(root / 'moto.log').read_text()}")


def _s3_env(url: str) -> None:
    """Before any session exists, so the launcher and the jobs see the endpoint too."""
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": url,
                       "AWS_CONFIG_FILE": os.devnull,
                       "AWS_SHARED_CREDENTIALS_FILE": os.devnull})
    os.environ.pop("AWS_PROFILE", None)


def _row(label: str, times: list[float], anchor: float, extra: str = "") -> None:
    med = statistics.median(times)
    print(f"{label:<50} {med:7.3f} s  (+{med - anchor:.3f} s, {med / anchor:.2f}×; "
          f"min {min(times):.3f}, max {max(times):.3f}){extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--mb", type=int, default=8, help="size of the training channel")
    ap.add_argument("--no-s3", action="store_true", help="skip the s3:// channel variant")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-train-", dir=scratch()))
    moto = None if args.no_s3 else _moto(root)
    if moto is not None:
        _s3_env(moto[1])
    import shoal

    session = shoal.Session(home=str(root / "home"))
    try:
        src, data = _prepare(root, args.mb)
        direct = direct_seconds(src, data, root, args.runs)
        local, _ = shoal_seconds(session, src, str(data), args.runs)
        anchor = statistics.median(direct)
        print(f"CPU: {cpu_model()}")
        print(f"train.py over a {args.mb} MB channel, median of {args.runs} runs each")
        print(f"{'direct: python train.py with the SM_* variables':<50} {anchor:7.3f} s  "
              f"(min {min(direct):.3f}, max {max(direct):.3f})")
        over = statistics.median(local) - anchor
        _row("shoal Estimator.fit, local channel (linked)", local, anchor,
             f"  target ≤ +1 s: {'met' if over <= 1.0 else 'NOT met'}")
        if moto is not None:
            import boto3

            bucket = "shoal-bench"
            boto3.client("s3", endpoint_url=moto[1]).create_bucket(Bucket=bucket)
            uri = session.upload_data(str(data), bucket=f"s3://{bucket}", key_prefix="training")
            remote, names = shoal_seconds(session, src, uri, args.runs)
            copy = statistics.median(_copy_seconds(session, names))
            over = statistics.median(remote) - anchor
            _row("shoal Estimator.fit, s3:// channel (copied)", remote, anchor,
                 f"; copy {copy:.3f} s, overhead less copy +{over - copy:.3f} s: "
                 f"{'met' if over - copy <= 1.0 else 'NOT met'}")
        elif not args.no_s3:
            print("(s3:// variant skipped: moto[server] and boto3 are not installed)")
    finally:
        stop_background(session)
        if moto is not None:
            moto[0].terminate()
            moto[0].wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
