"""Script-mode jobs inside the supervisor: SageMaker's training container, emulated.

For each attempt the job directory is laid out as ``/opt/ml`` is in a SageMaker container::

    input/data/<channel>/     the channel's files (a link when the data is on this machine)
    input/config/             hyperparameters.json, inputdataconfig.json, resourceconfig.json
    code/                     source_dir, unpacked from sourcedir.tar.gz
    model/                    -> <output_path>/<job>/output/model.tar.gz after exit 0
    output/data/              -> <output_path>/<job>/output/output.tar.gz
    output/failure            its text becomes the failure reason
    checkpoints/              synced to the checkpoint URI while the job runs; restored first

and the script runs with every ``SM_*`` variable and the hyperparameters as ``--key value``
arguments. Several ranks (``instance_count`` > 1, or ``use_torchrun``) run under
``shoal.jobs._ranks`` with the torchrun variables. Output lines are matched against the
metric definitions as they stream; each series is stored with timestamps.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shoal.core.experiments import job_owner, run_owner
from shoal.core.jobs import (
    Distribution,
    FailureKind,
    JobKind,
    JobRecord,
    JobSpec,
    TrainingSpec,
)
from shoal.core.ports import (
    LOST_HOSTS,
    RANK_HOST_LAUNCHER,
    RANK_MASTER_ADDR,
    ArtifactStore,
    MetricStore,
)
from shoal.errors import ShoalError
from shoal.jobs._metrictap import MetricTap
from shoal.jobs._prepare import PrepareError
from shoal.jobs._process import ExecProcess, JobProcess
from shoal.jobs.checkpoints import CHECKPOINT_SYNC_SECONDS, Checkpoints
from shoal.jobs.logsink import LogSink
from shoal.storage.artifacts import FsspecArtifactStore, job_key

__all__ = ["CHECKPOINT_SYNC_SECONDS", "CheckpointTap", "TrainingAttempt", "hyperparameter_args",
           "ranks_of"]

_METRIC_FLUSH_S = 1.0
_OPT_ML = "/opt/ml"
#: A placed job's supervisor variables, which its ranks have no use for.
_PLACEMENT_VARS = frozenset({RANK_HOST_LAUNCHER, RANK_MASTER_ADDR, "SHOAL_RAY_PLACEMENT"})
_ONE_RANK = Distribution()
_NO_TRAINING = TrainingSpec(entry_point="")



def ranks_of(spec: JobSpec) -> Distribution:
    """How many processes *spec* runs (one unless it has a distribution)."""
    return spec.distribution or _ONE_RANK


def hyperparameter_args(hps: Mapping[str, Any]) -> list[str]:
    """``--key value`` in sorted key order; strings as they are, anything else JSON-encoded."""
    args: list[str] = []
    for key in sorted(hps):
        value = hps[key]
        args += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return args


def _hp_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class CheckpointTap:
    """The checkpoints of a function job that took a ``CheckpointLocation``, kept by its
    supervisor as a script job's are: restored into ``checkpoints/`` of the attempt's directory
    before the function starts, synced every ``interval`` seconds while it runs and once more
    when it has ended, whatever the outcome (completed, failed, stopped, timed out)."""

    def __init__(self, record: JobRecord, workdir: Path, sink: LogSink, *,
                 interval: float = CHECKPOINT_SYNC_SECONDS) -> None:
        self.sink = sink
        self.checkpoints = Checkpoints(workdir / "checkpoints",
                                       str(record.spec.checkpoint_s3_uri), interval)

    def _log(self, msg: str) -> None:
        self.sink.write(f"[shoal] {msg}\n".encode())

    def setup(self) -> None:
        self.checkpoints.restore_for_job(self._log)

    def on_output(self, data: bytes) -> None:
        pass

    def next_tick(self, now: float) -> float:
        return self.checkpoints.due()

    def tick(self, now: float) -> None:
        if now >= self.checkpoints.due():
            self.checkpoints.sync_for_job(self._log)

    def close(self) -> None:
        self.checkpoints.sync_for_job(self._log)


class TrainingAttempt:
    """One attempt of a script job (or a multi-rank function job) under a supervisor."""

    def __init__(self, record: JobRecord, workdir: Path, sink: LogSink, *, artifacts: ArtifactStore,
                 metadata: MetricStore, cores: int, attempt: int = 1,
                 checkpoint_sync_seconds: float = CHECKPOINT_SYNC_SECONDS) -> None:
        self.record = record
        self.attempt = attempt
        self.spec = record.spec
        self.cfg = record.spec.training or _NO_TRAINING  # a multi-rank function job has none
        self.workdir = workdir
        self.sink = sink
        self._artifacts = artifacts
        self._metadata = metadata
        self._cores = cores
        self.ranks = ranks_of(record.spec)
        self.is_script = record.spec.kind == JobKind.SCRIPT
        owners = [job_owner(record.name)]
        run = record.spec.run
        if run:
            owners.append(run_owner(run.experiment_name, run.run_name))
        defs = [(d["Name"], re.compile(d["Regex"].encode())) for d in
                self.cfg.metric_definitions]
        self.metrics = MetricTap(defs, tuple(owners), metadata)
        self.checkpoints: Checkpoints | None = None
        self._sync_seconds = checkpoint_sync_seconds
        #: The supervisor's environment, for the launchers of a placed job's other hosts.
        self.supervisor_env: Mapping[str, str] | None = None

    # --- layout -----------------------------------------------------------------------

    def path(self, sm_path: str) -> Path:
        """A SageMaker container path (``/opt/ml/...``) inside this job's directory."""
        if sm_path == _OPT_ML or sm_path.startswith(_OPT_ML + "/"):
            return self.workdir / sm_path[len(_OPT_ML):].lstrip("/")
        return Path(sm_path)

    def setup(self) -> None:
        """Lay out the container directory; raises PrepareError naming what is wrong."""
        w = self.workdir
        for d in ("input/config", "input/data", "model", "output/data", "code"):
            (w / d).mkdir(parents=True, exist_ok=True)
        if self.is_script:
            self._unpack_source()
            for name, channel in self.cfg.channels.items():
                self._stage_channel(name, channel)
        self._write_config()
        local = self.path(self.cfg.checkpoint_local_path or f"{_OPT_ML}/checkpoints")
        uri = (self.cfg.checkpoint_s3_uri or self.spec.checkpoint_s3_uri
               or self._artifacts.uri(job_key(self.record.name, "checkpoints")))
        self.checkpoints = Checkpoints(local, uri, self._sync_seconds)
        self.checkpoints.restore_for_job(self._log)

    def _log(self, msg: str) -> None:
        self.sink.write(f"[shoal] {msg}\n".encode())

    def _unpack_source(self) -> None:
        key = self.cfg.source_key
        if not key:
            return
        from shoal._internal.archives import extract_tar

        archive = self.workdir / "sourcedir.tar.gz"
        try:
            self._artifacts.get_file(key, archive)
        except (ShoalError, OSError) as e:
            archive.unlink(missing_ok=True)
            raise PrepareError(FailureKind.INTERNAL,
                               f"cannot fetch the job's source {key}: {e}") from e
        try:
            # Caps on size and file count (SHOAL_MAX_EXTRACT_*), checked while extracting.
            extract_tar(archive, self.workdir / "code",
                        label=f"the job's source {key} (source_dir)")
        except ShoalError as e:
            raise PrepareError(FailureKind.ENVIRONMENT, f"cannot unpack the job's source: {e}"
                               ) from e
        finally:
            archive.unlink(missing_ok=True)

    def _stage_channel(self, name: str, channel: Mapping[str, Any]) -> None:
        import fsspec.core

        uri = str(channel["uri"])
        target = self.workdir / "input" / "data" / name
        t0 = time.monotonic()
        try:
            fs, path = fsspec.core.url_to_fs(uri)
            protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
            if "file" in protocols:
                source = Path(path)
                if source.is_dir():  # on this machine: link, do not copy
                    target.symlink_to(source, target_is_directory=True)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    (target / source.name).symlink_to(source)
                if not source.exists():
                    raise FileNotFoundError(path)
                self._log(f"channel {name}: linked {uri}")
                return
            if not fs.exists(path):
                raise FileNotFoundError(uri)
            target.mkdir(parents=True, exist_ok=True)
            if fs.isdir(path):
                files = [p for p in fs.find(path) if not p.endswith("/")]
                base = path.rstrip("/") + "/"
                for i, remote in enumerate(files, 1):
                    rel = remote[len(base):] if remote.startswith(base) else Path(remote).name
                    dest = target / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    fs.get_file(remote, str(dest))
                    if i % 100 == 0:
                        self._log(f"channel {name}: {i}/{len(files)} files copied")
                count = len(files)
            else:
                fs.get_file(path, str(target / Path(path).name))
                count = 1
        except (OSError, ValueError, ImportError) as e:
            raise PrepareError(FailureKind.ENVIRONMENT,
                               f"channel {name!r}: cannot stage {uri}: {type(e).__name__}: "
                               f"{e}") from e
        size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
        self._log(f"channel {name}: copied {count} file(s), {size / 1e6:.1f} MB from {uri} in "
                  f"{time.monotonic() - t0:.2f} s")

    def hosts(self) -> list[str]:
        return [f"algo-{i + 1}" for i in range(self.ranks.hosts)]

    def _write_config(self) -> None:
        cfg_dir = self.workdir / "input" / "config"
        hps = self.cfg.hyperparameters
        (cfg_dir / "hyperparameters.json").write_text(
            json.dumps({k: _hp_text(v) for k, v in hps.items()}, sort_keys=True))
        channels = self.cfg.channels
        data_config = {}
        for name, ch in channels.items():
            entry = {"TrainingInputMode": ch.get("input_mode") or "File",
                     "S3DistributionType": ch.get("distribution") or "FullyReplicated",
                     "RecordWrapperType": ch.get("record_wrapping") or "None"}
            if ch.get("content_type"):
                entry["ContentType"] = ch["content_type"]
            data_config[name] = entry
        (cfg_dir / "inputdataconfig.json").write_text(json.dumps(data_config, sort_keys=True))
        (cfg_dir / "resourceconfig.json").write_text(json.dumps(self._resource_config("algo-1")))

    def _resource_config(self, host: str) -> dict[str, Any]:
        itype = self.spec.instance_type or "local"
        return {"current_host": host, "current_instance_type": itype,
                "current_group_name": "homogeneousCluster", "hosts": self.hosts(),
                "instance_groups": [{"instance_group_name": "homogeneousCluster",
                                     "instance_type": itype, "hosts": self.hosts()}],
                "network_interface_name": "lo"}

    # --- environment --------------------------------------------------------------------

    def environment(self, host: str = "algo-1") -> dict[str, str]:
        """The ``SM_*`` variables of the training toolkit, for the rank on *host*."""
        w = self.workdir
        hps = dict(self.cfg.hyperparameters)
        channels = sorted(self.cfg.channels)
        entry = self.cfg.entry_point
        module = Path(entry).stem
        threads = max(1, min(int(self.spec.cpus or self._cores), self._cores))
        env = {
            "SM_MODEL_DIR": str(w / "model"), "SM_OUTPUT_DIR": str(w / "output"),
            "SM_OUTPUT_DATA_DIR": str(w / "output" / "data"),
            "SM_OUTPUT_INTERMEDIATE_DIR": str(w / "output" / "intermediate"),
            "SM_INPUT_DIR": str(w / "input"), "SM_INPUT_CONFIG_DIR": str(w / "input" / "config"),
            "SM_CHANNELS": json.dumps(channels), "SM_HPS": json.dumps(hps, sort_keys=True),
            "SM_NUM_CPUS": str(threads), "SM_NUM_GPUS": str(self.spec.gpus),
            "SM_NUM_NEURONS": "0", "SM_HOSTS": json.dumps(self.hosts()), "SM_CURRENT_HOST": host,
            "SM_CURRENT_INSTANCE_TYPE": self.spec.instance_type or "local",
            "SM_NETWORK_INTERFACE_NAME": "lo", "SM_MODULE_NAME": module,
            "SM_MODULE_DIR": str(self.cfg.source_uri or w / "code"),
            "SM_USER_ENTRY_POINT": entry, "SM_USER_ARGS": json.dumps(hyperparameter_args(hps)),
            "SM_FRAMEWORK_MODULE": self.cfg.framework_module,
            "SM_LOG_LEVEL": "20", "SM_INPUT_DATA_CONFIG": (
                w / "input" / "config" / "inputdataconfig.json").read_text(),
            "SM_RESOURCE_CONFIG": json.dumps(self._resource_config(host)),
            "SM_CHECKPOINT_DIR": str(self.checkpoints.local if self.checkpoints else ""),
            "SM_IS_MASTER": "true" if host == "algo-1" else "false",
            "SM_MASTER_ADDR": "127.0.0.1",
        }
        for name in channels:
            env[f"SM_CHANNEL_{name.upper()}"] = str(w / "input" / "data" / name)
        for key, value in hps.items():
            env[f"SM_HP_{key.upper()}"] = _hp_text(value)
        training_env = {
            "job_name": self.record.name, "model_dir": env["SM_MODEL_DIR"],
            "output_data_dir": env["SM_OUTPUT_DATA_DIR"], "output_dir": env["SM_OUTPUT_DIR"],
            "input_dir": env["SM_INPUT_DIR"], "input_config_dir": env["SM_INPUT_CONFIG_DIR"],
            "channel_input_dirs": {n: env[f"SM_CHANNEL_{n.upper()}"] for n in channels},
            "hyperparameters": hps, "hosts": self.hosts(), "current_host": host,
            "num_cpus": threads, "num_gpus": self.spec.gpus, "module_name": module,
            "module_dir": env["SM_MODULE_DIR"], "user_entry_point": entry,
            "network_interface_name": "lo", "log_level": 20,
            "input_data_config": json.loads(env["SM_INPUT_DATA_CONFIG"]),
            "resource_config": self._resource_config(host),
            "is_master": host == "algo-1", "master_hostname": "algo-1",
            "current_instance_type": env["SM_CURRENT_INSTANCE_TYPE"],
        }
        env["SM_TRAINING_ENV"] = json.dumps(training_env, sort_keys=True)
        return env

    # --- process ----------------------------------------------------------------------

    def command(self, python: str) -> list[str]:
        entry = self.cfg.entry_point
        hps = self.cfg.hyperparameters
        runner = [python] if entry.endswith(".py") else ["/bin/sh"]
        return [*runner, entry, *hyperparameter_args(hps)]

    def start(self, python: str, env: dict[str, str], memory_mib: int | None) -> JobProcess:
        """Start the script (or the ranks); the job's process group holds every rank."""
        cwd = self.workdir / "code" if self.is_script else self.workdir
        if self.ranks.world == 1:
            env = {**env, **self.environment()}
            if self.is_script:
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (str(cwd), env.get("PYTHONPATH", "")) if p)
            return ExecProcess.run(self.command(python) if self.is_script else
                                   [python, "-m", "shoal.jobs._entrypoint", str(self.workdir)],
                                   cwd=cwd, env=env, memory_mib=memory_mib)
        plan = {"grace_seconds": self.spec.stop_grace_period_in_seconds,
                "ranks": self._rank_plans(python, env)}
        plan_file = self.workdir / "ranks.json"
        plan_file.write_text(json.dumps(plan))
        # The launcher needs only the standard library; our own interpreter runs it.
        launcher_env = {k: v for k, v in env.items() if k != "SHOAL_JOB_KEY"}
        launcher_env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
        return ExecProcess.run([sys.executable, "-m", "shoal.jobs._ranks", str(plan_file)],
                               cwd=self.workdir, env=launcher_env, memory_mib=None)

    def _rank_plans(self, python: str, env: dict[str, str]) -> list[dict[str, Any]]:
        """Every rank's plan, or with a host launcher (``SHOAL_RANK_HOST_LAUNCHER``: a cluster
        backend placed the job on several nodes) this host's ranks and one launcher per other
        host, which starts that host's ranks on its node (``run_host``)."""
        port = _free_port()
        launcher = env.get(RANK_HOST_LAUNCHER)
        addr = env.get(RANK_MASTER_ADDR) or "127.0.0.1"
        plans = []
        for host_i, host in enumerate(self.hosts()):
            if launcher and host_i > 0:
                spec = {"job": self.record.name, "attempt": self.attempt, "host_index": host_i,
                        "master_addr": addr, "master_port": port,
                        "grace_seconds": self.spec.stop_grace_period_in_seconds}
                # The supervisor's own environment: not the job's variables (secrets).
                launcher_env = dict(self.supervisor_env or env)
                launcher_env.pop("SHOAL_JOB_KEY", None)
                launcher_env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
                # Its output arrives prefixed by that host's own rank launcher.
                plans.append({"argv": [sys.executable, "-m", launcher, json.dumps(spec)],
                              "env": launcher_env, "cwd": str(self.workdir), "label": host,
                              "raw": True})
            else:
                plans += self.host_plans(python, env, host_i, addr, port)
        return plans

    def host_plans(self, python: str, env: dict[str, str], host_i: int, master_addr: str,
                   master_port: int) -> list[dict[str, Any]]:
        """The plans of the ranks on host *host_i* (``algo-<host_i + 1>``)."""
        r = self.ranks
        host = self.hosts()[host_i]
        plans = []
        for local in range(r.per_host):
            rank = host_i * r.per_host + local
            rank_env = {k: v for k, v in env.items() if k not in _PLACEMENT_VARS
                        and not k.startswith("RAY_AUTH")}
            rank_env.update(self.environment(host), SM_MASTER_ADDR=master_addr)
            if r.torchrun:
                rank_env.update({
                    "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
                    "WORLD_SIZE": str(r.world), "RANK": str(rank), "LOCAL_RANK": str(local),
                    "LOCAL_WORLD_SIZE": str(r.per_host), "GROUP_RANK": str(host_i),
                    "NODE_RANK": str(host_i), "TORCHELASTIC_RUN_ID": self.record.name})
            if self.is_script:
                cwd = self.workdir / "code"
                rank_env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (str(cwd), env.get("PYTHONPATH", "")) if p)
                argv = self.command(python)
            else:  # a function: rank 0 in the job directory, the others beside it
                cwd = self.workdir if rank == 0 else self._rank_dir(rank)
                argv = [python, "-m", "shoal.jobs._entrypoint", str(cwd)]
                rank_env.setdefault("SHOAL_JOB_CWD", str(cwd))
            label = f"{host} rank {rank}" if r.world > 1 else host
            plans.append({"argv": argv, "env": rank_env, "cwd": str(cwd), "label": label})
        return plans

    def _rank_dir(self, rank: int) -> Path:
        d = self.workdir / f"rank-{rank}"
        d.mkdir(exist_ok=True)
        for name in ("function.pkl", "function.json", "arguments.pkl", "arguments.json"):
            src = self.workdir / name
            if src.exists() and not (d / name).exists():
                (d / name).symlink_to(src)
        return d

    # --- while it runs ------------------------------------------------------------------

    def on_output(self, data: bytes) -> None:
        self.metrics.feed(data)

    def next_tick(self, now: float) -> float:
        due = now + 3600.0
        if self.metrics.pending:
            due = min(due, self.metrics.last_flush + _METRIC_FLUSH_S)
        if self.checkpoints is not None:
            due = min(due, self.checkpoints.due())
        return due

    def tick(self, now: float) -> None:
        if self.metrics.pending and now >= self.metrics.last_flush + _METRIC_FLUSH_S:
            self._flush_metrics()
        if self.checkpoints is not None and now >= self.checkpoints.due():
            self._sync_checkpoints()

    def _flush_metrics(self, final: bool = False) -> None:
        try:
            self.metrics.flush(final=final)
        except ShoalError as e:  # metrics must not kill a training run; say so in its log
            self._log(f"could not store metrics: {e}")

    def _sync_checkpoints(self) -> None:
        if self.checkpoints is not None:
            self.checkpoints.sync_for_job(self._log)

    # --- the end ------------------------------------------------------------------------

    def close(self) -> None:
        """After the process ended, whatever the outcome: last metrics and checkpoints."""
        self._flush_metrics(final=True)
        self._sync_checkpoints()

    def lost_hosts(self) -> str | None:
        """What another host's launcher reported losing (its node or actor), if anything:
        an infrastructure failure, worth another attempt."""
        with contextlib.suppress(OSError):
            return (self.workdir / LOST_HOSTS).read_text(errors="replace").strip() or None
        return None

    def failure_text(self) -> str | None:
        path = self.workdir / "output" / "failure"
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace").strip()
            return text[:4000] or None
        return None

    def upload_outputs(self) -> list[str]:
        """``model/`` and ``output/data/`` as tar.gz files under the output path."""
        out_root = self.cfg.output_path
        store = FsspecArtifactStore.open(out_root) if out_root else self._artifacts
        uris = []
        for src, fname in (("model", "model.tar.gz"), ("output/data", "output.tar.gz")):
            archive = self.workdir / f".{fname}"
            t0 = time.monotonic()
            with tarfile.open(archive, "w:gz", compresslevel=6) as tar:
                base = self.workdir / src
                for path in sorted(base.rglob("*")):
                    tar.add(path, arcname=path.relative_to(base).as_posix(), recursive=False)
            key = job_key(self.record.name, "output", fname)
            store.put_file(key, archive)
            size = archive.stat().st_size
            archive.unlink()
            uris.append(store.uri(key))
            self._log(f"uploaded {src}/ as {store.uri(key)} ({size / 1e6:.2f} MB) in "
                      f"{time.monotonic() - t0:.2f} s")
        return uris


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
