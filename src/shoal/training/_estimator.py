"""``Estimator`` and its framework flavours: script-mode training jobs under SageMaker's names.

``fit()`` checks everything it can before anything starts (entry point, channels, metric
regexes, hyperparameter names), packs ``source_dir`` as ``sourcedir.tar.gz`` in the job's
prefix and submits a script job; the supervisor lays out the SageMaker container directory and
runs the script with the ``SM_*`` contract (``shoal/jobs/_training.py``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shoal.core.clock import RandomIdFactory
from shoal.core.experiments import job_owner
from shoal.core.jobs import JobKind, JobName, JobRecord, JobSpec, JobStatus
from shoal.core.resources import resolve_instance_type
from shoal.core.secrets import mask_env
from shoal.errors import InvalidArgumentError, JobFailedError
from shoal.image_uris import parse_image_uri
from shoal.remote_function._options import _normalise_tags, check_gpus
from shoal.training._framework_env import (
    check_py_version,
    framework_requirements,
    installed_version,
    requirement_bounds,
)
from shoal.training._inputs import resolve_channels
from shoal.training._models import FrameworkModelMaker

__all__ = ["Estimator", "Framework", "PyTorch", "SKLearn", "TrainingJob"]

_FLAG = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_OPT_ML_CHECKPOINTS = "/opt/ml/checkpoints"
# SageMaker settings with no meaning on this backend: kept on the record, reported once.
_INERT = ("image_uri", "role", "volume_size", "volume_kms_key", "output_kms_key", "subnets",
          "security_group_ids", "model_uri", "model_channel_name",
          "encrypt_inter_container_traffic", "use_spot_instances", "max_wait",
          "enable_network_isolation", "rules", "debugger_hook_config",
          "tensorboard_output_config", "enable_sagemaker_metrics", "profiler_config",
          "disable_profiler", "git_config", "container_log_level", "code_location",
          "instance_groups", "training_repository_access_mode",
          "training_repository_credentials_provider_arn", "enable_infra_check",
          "container_entry_point", "container_arguments", "disable_output_compression",
          "enable_remote_debug", "input_mode", "image_uri_region", "training_plan")
_SAGEMAKER_STATUS = {
    JobStatus.PENDING: "InProgress", JobStatus.STARTING: "InProgress",
    JobStatus.RUNNING: "InProgress", JobStatus.STOPPING: "Stopping",
    JobStatus.COMPLETED: "Completed", JobStatus.FAILED: "Failed", JobStatus.STOPPED: "Stopped",
}
_SECONDARY = {
    JobStatus.PENDING: "Starting", JobStatus.STARTING: "Downloading",
    JobStatus.RUNNING: "Training", JobStatus.STOPPING: "Stopping",
    JobStatus.COMPLETED: "Completed", JobStatus.FAILED: "Failed", JobStatus.STOPPED: "Stopped",
}


def _session(given: Any) -> Any:
    from shoal.session import Session, current

    return given if isinstance(given, Session) else current()


class Estimator:
    """A script-mode training job, configured once and run with ``fit()``.

    Example:
        >>> from shoal.estimator import Estimator                    # doctest: +SKIP
        >>> est = Estimator(entry_point="train.py", source_dir="src",  # doctest: +SKIP
        ...                 hyperparameters={"epochs": 2},
        ...                 metric_definitions=[{"Name": "loss", "Regex": "loss=([0-9.]+)"}])
        >>> est.fit({"training": "data/train"})                        # doctest: +SKIP
        >>> est.model_data                                             # doctest: +SKIP
    """

    _framework: tuple[str, str] | None = None  # (distribution, version pin) of a framework

    def __init__(self, image_uri: str | None = None, role: str | None = None,
                 instance_count: int | None = 1, instance_type: str | None = None,
                 keep_alive_period_in_seconds: int | None = None, volume_size: int = 30,
                 max_run: int = 24 * 60 * 60, output_path: str | None = None,
                 base_job_name: str | None = None, sagemaker_session: Any = None,
                 hyperparameters: Mapping[str, Any] | None = None, tags: Any = None,
                 metric_definitions: list[Mapping[str, str]] | None = None,
                 checkpoint_s3_uri: str | None = None, checkpoint_local_path: str | None = None,
                 environment: Mapping[str, str] | None = None,
                 max_retry_attempts: int | None = None, source_dir: str | None = None,
                 entry_point: str | None = None, dependencies: Any = None,
                 distribution: Mapping[str, Any] | None = None,
                 allow_cpu_fallback: bool = False, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(_INERT))
        if unknown:
            raise InvalidArgumentError(f"unknown Estimator argument(s) {', '.join(unknown)}",
                                       arguments=unknown)
        self.sagemaker_session = _session(sagemaker_session)
        self.inert = {k: v for k, v in kwargs.items() if v not in (None, False)}
        image = parse_image_uri(image_uri)  # image_uris.retrieve's URI names a framework
        if image_uri and image is None:
            self.inert["image_uri"] = image_uri
        self._framework = self._framework or (image.requirement if image else None)
        if role:
            self.inert["role"] = role
        self.entry_point, self.source_dir = _check_code(entry_point, source_dir)
        self.hyperparameters_ = _check_hyperparameters(hyperparameters)
        self.metric_definitions = _check_metrics(metric_definitions)
        self.instance_count = _positive(instance_count or 1, "instance_count")
        self.instance_type = instance_type or "local"
        self._itype = resolve_instance_type(self.instance_type)
        self.allow_cpu_fallback = allow_cpu_fallback
        self._gpu_note = self._check_gpus()
        self.max_run = _positive(max_run, "max_run")
        self.max_retry_attempts = _positive(max_retry_attempts or 1, "max_retry_attempts")
        keep = keep_alive_period_in_seconds or 0
        if not isinstance(keep, int) or isinstance(keep, bool) or not 0 <= keep <= 3600:
            raise InvalidArgumentError("keep_alive_period_in_seconds must be an integer from 0 "
                                       f"to 3600, got {keep!r}",
                                       argument="keep_alive_period_in_seconds")
        self.keep_alive_period_in_seconds = keep
        self.output_path = output_path.rstrip("/") if output_path else None
        self.base_job_name = base_job_name
        self.tags = tuple(_normalise_tags(tags))
        env = dict(environment or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise InvalidArgumentError("environment must map str to str", argument="environment")
        self.environment = env
        self.checkpoint_s3_uri = checkpoint_s3_uri.rstrip("/") if checkpoint_s3_uri else None
        self.checkpoint_local_path = checkpoint_local_path
        self.dependencies = dependencies
        self._requirements = self._requirements_file()
        self.distribution = dict(distribution or {})
        self._ranks = self._check_distribution()
        self.latest_training_job: TrainingJob | None = None
        self._current_job_name: str | None = None

    # --- validation -------------------------------------------------------------------

    def _check_gpus(self) -> str | None:
        return check_gpus(self._itype.name, self._itype.gpus, self.allow_cpu_fallback)

    def _check_distribution(self) -> dict[str, Any]:
        dist = self.distribution
        torchrun = False
        for key in ("torch_distributed", "pytorchddp"):
            if key in dist:
                torchrun = bool((dist[key] or {}).get("enabled", False))
        unsupported = sorted(set(dist) - {"torch_distributed", "pytorchddp"})
        if unsupported:
            raise InvalidArgumentError(
                f"distribution {', '.join(unsupported)} is not supported; use "
                "{'torch_distributed': {'enabled': True}}", argument="distribution")
        per_host = max(1, 0 if self._gpu_note else self._itype.gpus) if torchrun else 1
        return {"hosts": self.instance_count, "per_host": per_host, "torchrun": torchrun}

    def _requirements_file(self) -> Path | None:
        deps = self.dependencies
        if isinstance(deps, (str, os.PathLike)):
            path = Path(deps).expanduser().resolve()
            if not path.is_file():
                raise InvalidArgumentError(f"dependencies file {deps} does not exist (looked for "
                                           f"{path})", argument="dependencies")
            return path
        if deps is not None and not isinstance(deps, (list, tuple)):
            raise InvalidArgumentError("dependencies must be a requirements file, or a list of "
                                       "directories to ship with source_dir",
                                       argument="dependencies")
        for d in deps or ():
            if not Path(d).exists():
                raise InvalidArgumentError(f"dependency {d} does not exist",
                                           argument="dependencies")
        if self.source_dir is not None and (self.source_dir / "requirements.txt").is_file():
            return self.source_dir / "requirements.txt"
        return None

    # --- SageMaker's surface ------------------------------------------------------------

    def hyperparameters(self) -> dict[str, Any]:
        return dict(self.hyperparameters_)

    def set_hyperparameters(self, **kwargs: Any) -> None:
        self.hyperparameters_ = _check_hyperparameters({**self.hyperparameters_, **kwargs})

    @property
    def _output_root(self) -> str:
        return self.output_path or self.sagemaker_session.artifacts.root

    @property
    def model_data(self) -> str:
        """``<output_path>/<job>/output/model.tar.gz`` of the latest training job."""
        job = self._require_job()
        record = job.record()
        if record.status != JobStatus.COMPLETED:
            raise InvalidArgumentError(f"training job {job.name} is {record.status}; model_data "
                                       "exists once it has completed", job=job.name)
        return job.model_data

    def _require_job(self) -> TrainingJob:
        if self.latest_training_job is None:
            raise InvalidArgumentError("this estimator has no training job yet: call fit() or "
                                       "Estimator.attach(job_name)")
        return self.latest_training_job

    def fit(self, inputs: Any = None, wait: bool = True, logs: bool | str = True,
            job_name: str | None = None, experiment_config: Mapping[str, str] | None = None
            ) -> None:
        """Check the inputs, submit the training job and (with *wait*) follow it to its end."""
        channels = resolve_channels(inputs)
        session = self.sagemaker_session
        name = self._job_name(job_name)
        run = self._run_context(experiment_config)
        with tempfile.TemporaryDirectory(prefix="shoal-src-") as tmp:
            archive = Path(tmp) / "sourcedir.tar.gz"
            self._pack(archive)
            files: dict[str, bytes | Path] = {"source/sourcedir.tar.gz": archive}
            requirements = self._env_requirements()
            if requirements is not None:
                files["env/requirements.txt"] = requirements.encode()
            spec = self._spec(name, channels, session, run, requirements)
            record = session.jobs.submit_script(spec, files)
        if run is not None:
            session.metadata.link_run_job(run["experiment_name"], run["run_name"], name)
        self.latest_training_job = TrainingJob(self, record.name)
        self._current_job_name = record.name
        if wait:
            self.latest_training_job.wait(logs=bool(logs))

    def _job_name(self, given: str | None) -> str:
        if given is not None:
            if not _JOB_NAME.match(given):
                raise InvalidArgumentError(f"job_name {given!r} must be 1-63 letters, digits or "
                                           "hyphens, starting with a letter or digit",
                                           argument="job_name")
            return given
        base = self.base_job_name or Path(self.entry_point).stem or "training"
        return str(RandomIdFactory().job_name(base, datetime.now(UTC)))

    @staticmethod
    def _run_context(experiment_config: Mapping[str, str] | None) -> dict[str, str] | None:
        if experiment_config:
            exp = experiment_config.get("ExperimentName")
            run = experiment_config.get("RunName") or experiment_config.get("TrialName")
            if exp and run:
                return {"experiment_name": exp, "run_name": run}
        from shoal.experiments import current_run_context

        return current_run_context()

    def _pack(self, archive: Path) -> None:
        """source_dir (or the entry point alone) and any dependency dirs, as a tar.gz."""
        with tarfile.open(archive, "w:gz", compresslevel=6) as tar:
            if self.source_dir is not None:
                for path in sorted(self.source_dir.rglob("*")):
                    rel = path.relative_to(self.source_dir)
                    if "__pycache__" in rel.parts or ".git" in rel.parts:
                        continue
                    tar.add(path, arcname=rel.as_posix(), recursive=False)
            else:
                tar.add(self.entry_point_path, arcname=Path(self.entry_point).name)
            if isinstance(self.dependencies, (list, tuple)):
                for dep in self.dependencies:
                    p = Path(dep).resolve()
                    tar.add(p, arcname=p.name, filter=_skip_caches)

    @property
    def entry_point_path(self) -> Path:
        return (self.source_dir / self.entry_point) if self.source_dir else Path(
            self.entry_point).resolve()

    def _env_requirements(self) -> str | None:
        """What the job's environment must install; None when the client's environment does."""
        user = self._requirements.read_text().rstrip("\n") if self._requirements else None
        lines, build = self._framework_requirements(user)
        if user is not None:
            return "\n".join([*lines, user]) + "\n"
        return "\n".join(lines) + "\n" if build else None

    def _framework_requirements(self, user: str | None) -> tuple[list[str], bool]:
        """(the framework's requirement lines, whether they need an environment of their own)."""
        return [], False

    def _serving_framework(self) -> tuple[str, ...]:
        """The framework lines an endpoint of this estimator's model installs (as SageMaker
        serves it in the framework's container): the training job's, or none when the
        client's environment has the framework."""
        lines, build = self._framework_requirements(None)
        return tuple(lines) if build else ()

    def _spec(self, name: str, channels: dict[str, Any], session: Any,
              run: dict[str, str] | None, requirements: str | None) -> JobSpec:
        training = {
            "entry_point": Path(self.entry_point).as_posix() if self.source_dir else
            Path(self.entry_point).name,
            "source_key": f"{name}/source/sourcedir.tar.gz",
            "source_uri": session.artifacts.uri(f"{name}/source/sourcedir.tar.gz"),
            "hyperparameters": dict(self.hyperparameters_), "channels": channels,
            "output_path": self.output_path, "output_root": self._output_root,
            "metric_definitions": [dict(d) for d in self.metric_definitions],
            "checkpoint_uri": self.checkpoint_s3_uri,
            "checkpoint_s3_uri": self.checkpoint_s3_uri,
            "checkpoint_local_path": self.checkpoint_local_path or _OPT_ML_CHECKPOINTS,
            "instance_count": self.instance_count,
            "distribution_config": self.distribution,
            "framework": list(self._framework) if self._framework else None,
            "framework_module": self._framework_module(),
            "estimator": type(self).__name__,
        }
        extra: dict[str, Any] = {"training": training, "distribution": self._ranks}
        if self._framework is not None:
            extra["sagemaker_alias"] = True  # as in SageMaker's containers: import sagemaker
        if getattr(self, "strict_versions", session.settings.strict_versions):
            extra["strict_versions"] = True
        for notice in getattr(self, "_framework_notices", ()):  # on the record, and warned once
            extra.setdefault("framework_notices", []).append(notice)
            session.report_inert(f"framework:{notice}", notice)
        if run is not None:
            extra["run"] = run
        if self._gpu_note:
            extra["gpu_fallback"] = self._gpu_note
        for key, value in self.inert.items():
            self.sagemaker_session.report_inert(
                key, f"{key}={value!r} has no effect on the "
                     f"{self.sagemaker_session.settings.backend} backend; it is kept on the job "
                     "record")
        deps = None
        if requirements is not None:
            deps = str(self._requirements or (self.source_dir or Path.cwd()) / "requirements.txt")
        return JobSpec(
            name=JobName(name), kind=JobKind.SCRIPT, function_name=training["entry_point"],
            instance_type=self._itype.name, cpus=float(self._itype.cpus),
            memory_mib=int(self._itype.memory_gib * 1024) or None,
            gpus=0 if self._gpu_note else self._itype.gpus,
            allow_cpu_fallback=self.allow_cpu_fallback,
            environment_variables=dict(self.environment), dependencies=deps,
            max_runtime_in_seconds=self.max_run, max_retry_attempts=self.max_retry_attempts,
            keep_alive_period_in_seconds=self.keep_alive_period_in_seconds, tags=self.tags,
            python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
            inert_settings=dict(self.inert), extra=extra)

    def _framework_module(self) -> str:
        return ""

    @classmethod
    def attach(cls, training_job_name: str, sagemaker_session: Any = None,
               model_channel_name: str = "model") -> Estimator:
        """An estimator for an existing training job; waits for it when it is still running."""
        session = _session(sagemaker_session)
        # Its secret variables are stored encrypted: decrypted with the job's key.
        record = session.jobs.unseal(session.jobs.get(training_job_name))
        cfg = record.spec.extra.get("training")
        if record.spec.kind != JobKind.SCRIPT or not cfg:
            raise InvalidArgumentError(f"job {training_job_name} is not a training job (it runs "
                                       f"{record.spec.kind} {record.spec.function_name})",
                                       job=training_job_name)
        est = cls.__new__(cls)
        est.sagemaker_session = session
        est.inert = dict(record.spec.inert_settings)
        est.entry_point = cfg["entry_point"]
        est.source_dir = None
        est.hyperparameters_ = dict(cfg.get("hyperparameters") or {})
        est.metric_definitions = list(cfg.get("metric_definitions") or [])
        est.instance_count = int(cfg.get("instance_count", 1))
        est.instance_type = record.spec.instance_type or "local"
        est._itype = resolve_instance_type(est.instance_type)
        est.allow_cpu_fallback = record.spec.allow_cpu_fallback
        est._gpu_note = record.spec.extra.get("gpu_fallback")
        est.max_run = record.spec.max_runtime_in_seconds
        est.max_retry_attempts = record.spec.max_retry_attempts
        est.keep_alive_period_in_seconds = record.spec.keep_alive_period_in_seconds
        est.output_path = cfg.get("output_path")
        est.base_job_name = None
        est.tags = record.spec.tags
        est.environment = dict(record.spec.environment_variables)
        est.checkpoint_s3_uri = cfg.get("checkpoint_s3_uri")
        est.checkpoint_local_path = cfg.get("checkpoint_local_path")
        est.dependencies = None
        est._requirements = None
        est.distribution = dict(cfg.get("distribution_config") or {})
        est._ranks = dict(record.spec.extra.get("distribution") or {})
        est.latest_training_job = TrainingJob(est, record.name)
        est._current_job_name = record.name
        if not record.is_terminal:
            est.latest_training_job.wait(logs=True)
        return est

    def logs(self) -> None:
        """Print the latest training job's log (following it while it runs)."""
        self._require_job().wait(logs=True)

    def stop(self) -> None:
        self._require_job().stop()

    def deploy(self, initial_instance_count: int | None = None,
               instance_type: str | None = None, serializer: Any = None,
               deserializer: Any = None, endpoint_name: str | None = None,
               wait: bool = True, **kwargs: Any) -> Any:
        """Serve the latest training job's ``model_data`` on an endpoint (named after the job
        unless *endpoint_name* is given); return its ``Predictor``. ``entry_point``,
        ``source_dir``, ``dependencies``, ``env`` and ``model_name`` go to the ``Model``; the
        rest to ``Model.deploy`` (``batching``, ``port``...)."""
        from shoal.endpoints import Model

        model_args = {k: kwargs.pop(k) for k in ("entry_point", "source_dir", "dependencies",
                                                 "env", "predictor_cls") if k in kwargs}
        kwargs.pop("use_compiled_model", None)
        model = Model(self.model_data, name=kwargs.pop("model_name", None),
                      sagemaker_session=self.sagemaker_session, **model_args)
        model.framework_requirements = self._serving_framework()
        return model.deploy(initial_instance_count, instance_type, serializer, deserializer,
                            endpoint_name=endpoint_name or self._require_job().name,
                            wait=wait, **kwargs)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(entry_point={self.entry_point!r}, "
                f"instance_type={self.instance_type!r}, instance_count={self.instance_count})")


class TrainingJob:
    """SageMaker's ``_TrainingJob``: the job behind ``estimator.latest_training_job``."""

    def __init__(self, estimator: Estimator, job_name: str) -> None:
        self.estimator = estimator
        self.name = self.job_name = job_name
        self._session = estimator.sagemaker_session

    def record(self) -> JobRecord:
        return self._session.jobs.get(self.name)

    @property
    def model_data(self) -> str:
        cfg = self.record().spec.extra.get("training") or {}
        root = cfg.get("output_path") or cfg.get("output_root") or self._session.artifacts.root
        return f"{str(root).rstrip('/')}/{self.name}/output/model.tar.gz"

    def wait(self, logs: bool = True) -> JobRecord:
        """Follow the job to its end; raise JobFailedError (naming it) unless it completed."""
        out = sys.stdout

        def show(chunk: bytes) -> None:
            out.write(chunk.decode(errors="replace"))
            out.flush()

        record = self._session.jobs.wait(self.name, on_output=show if logs else None)
        if record.status == JobStatus.COMPLETED:
            return record
        log = self._session.jobs.log_uri(self.name)
        raise JobFailedError(
            f"training job {self.name} {record.status}: {record.failure_reason or ''}".rstrip()
            + f"\nLog: {log}", job=self.name, log_uri=log, reason=record.failure_reason,
            status=str(record.status), exit_code=record.exit_code)

    def stop(self) -> None:
        self._session.jobs.cancel(self.name)

    def describe(self) -> dict[str, Any]:
        """The job in the shape of SageMaker's DescribeTrainingJob."""
        record = self.record()
        spec = record.spec
        cfg = spec.extra.get("training") or {}
        out: dict[str, Any] = {
            "TrainingJobName": record.name,
            "TrainingJobStatus": _SAGEMAKER_STATUS[record.status],
            "SecondaryStatus": _SECONDARY[record.status],
            "HyperParameters": {k: v if isinstance(v, str) else json.dumps(v)
                                for k, v in (cfg.get("hyperparameters") or {}).items()},
            "AlgorithmSpecification": {"TrainingInputMode": "File",
                                       "MetricDefinitions": cfg.get("metric_definitions") or []},
            "InputDataConfig": [{"ChannelName": n, "DataSource": {"S3DataSource": {
                "S3Uri": c["uri"], "S3DataType": "S3Prefix",
                "S3DataDistributionType": c.get("distribution") or "FullyReplicated"}}}
                for n, c in (cfg.get("channels") or {}).items()],
            "OutputDataConfig": {"S3OutputPath": cfg.get("output_path") or cfg.get(
                "output_root")},
            "ResourceConfig": {"InstanceType": spec.instance_type,
                               "InstanceCount": cfg.get("instance_count", 1)},
            "StoppingCondition": {"MaxRuntimeInSeconds": spec.max_runtime_in_seconds},
            "RetryStrategy": {"MaximumRetryAttempts": spec.max_retry_attempts},
            "Environment": mask_env(spec.environment_variables),
            "CreationTime": record.created_at,
            "LastModifiedTime": record.updated_at,
            "Tags": [{"Key": k, "Value": v} for k, v in spec.tags],
        }
        if record.started_at:
            out["TrainingStartTime"] = record.started_at
        if record.ended_at:
            out["TrainingEndTime"] = record.ended_at
        if record.duration_seconds is not None:
            out["TrainingTimeInSeconds"] = int(round(record.duration_seconds))
        if record.failure_reason:
            out["FailureReason"] = record.failure_reason
        if record.status == JobStatus.COMPLETED:
            out["ModelArtifacts"] = {"S3ModelArtifacts": self.model_data}
        if cfg.get("checkpoint_s3_uri"):
            out["CheckpointConfig"] = {"S3Uri": cfg["checkpoint_s3_uri"],
                                       "LocalPath": cfg.get("checkpoint_local_path")}
        run = spec.extra.get("run")
        if run:
            out["ExperimentConfig"] = {"ExperimentName": run["experiment_name"],
                                       "RunName": run["run_name"]}
        last: dict[str, Any] = {}
        for p in self._session.metadata.get_metrics(job_owner(record.name)):
            last[p.name] = p
        out["FinalMetricDataList"] = [
            {"MetricName": n, "Value": p.value, "Timestamp": datetime.fromtimestamp(
                p.timestamp, UTC)} for n, p in sorted(last.items())]
        return out


class Framework(Estimator):
    """An estimator whose job environment resolves as SageMaker's container for
    ``framework_version`` would, on the client's Python (``training/_framework_env.py``)."""

    _dist = ""
    _framework_name = ""

    def __init__(self, entry_point: str | None = None, framework_version: str | None = None,
                 py_version: str | None = None, source_dir: str | None = None,
                 hyperparameters: Mapping[str, Any] | None = None, image_uri: str | None = None,
                 distribution: Mapping[str, Any] | None = None, *,
                 strict_versions: bool | None = None, **kwargs: Any) -> None:
        installed = installed_version(self._dist)
        self.framework_version = framework_version or (installed.split("+")[0] if installed
                                                       else None)
        if self.framework_version is None:
            raise InvalidArgumentError(
                f"{type(self).__name__} needs framework_version= ({self._dist} is not installed "
                "here to default to)", argument="framework_version")
        super().__init__(entry_point=entry_point, source_dir=source_dir,
                         hyperparameters=hyperparameters, image_uri=image_uri,
                         distribution=distribution, **kwargs)
        settings = self.sagemaker_session.settings
        self.strict_versions = bool(getattr(settings, "strict_versions", False)
                                    if strict_versions is None else strict_versions)
        py_note = check_py_version(py_version, framework=self._framework_name,
                                   version=self.framework_version, strict=self.strict_versions)
        self._py_notice: tuple[str, ...] = (py_note,) if py_note else ()
        self._framework_notices = self._py_notice
        self.py_version = py_version or f"py{sys.version_info.major}{sys.version_info.minor}"
        _, release, _ = requirement_bounds(self._framework_name, self._dist,
                                           self.framework_version)
        self._framework = (self._dist, release)

    def _framework_requirements(self, user: str | None) -> tuple[list[str], bool]:
        lines, build, notices = framework_requirements(
            self._framework_name, self._dist, self.framework_version, user,
            strict=self.strict_versions,
            cache_dir=self.sagemaker_session.settings.home / "envs" / "framework-releases")
        self._framework_notices = (*self._py_notice, *notices)
        return lines, build


class PyTorch(FrameworkModelMaker, Framework):
    """``sagemaker.pytorch.PyTorch``: the job's environment has ``torch==framework_version``;
    ``create_model()`` returns a ``PyTorchModel``."""

    _dist = "torch"
    _framework_name = "pytorch"

    def _model_class(self) -> type[Any]:
        from shoal.endpoints._framework_models import PyTorchModel

        return PyTorchModel

    def _framework_module(self) -> str:
        return "sagemaker_pytorch_container.training:main"


class SKLearn(FrameworkModelMaker, Framework):
    """``sagemaker.sklearn.SKLearn``; ``framework_version`` "1.2-1" pins scikit-learn 1.2.*;
    ``create_model()`` returns an ``SKLearnModel``."""

    _dist = "scikit-learn"
    _framework_name = "sklearn"

    def _model_class(self) -> type[Any]:
        from shoal.endpoints._framework_models import SKLearnModel

        return SKLearnModel

    def __init__(self, entry_point: str | None = None, framework_version: str | None = None,
                 py_version: str | None = "py3", source_dir: str | None = None,
                 hyperparameters: Mapping[str, Any] | None = None, image_uri: str | None = None,
                 *, strict_versions: bool | None = None, **kwargs: Any) -> None:
        if kwargs.get("instance_count", 1) not in (1, None):
            raise InvalidArgumentError("SKLearn trains on one instance (as on SageMaker); use "
                                       "instance_count=1", argument="instance_count")
        super().__init__(entry_point=entry_point, framework_version=framework_version,
                         py_version=py_version, source_dir=source_dir,
                         hyperparameters=hyperparameters, image_uri=image_uri,
                         strict_versions=strict_versions, **kwargs)

    def _framework_module(self) -> str:
        return "sagemaker_sklearn_container.training:main"


# --- checks ------------------------------------------------------------------------------

def _positive(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}",
                                   argument=name)
    return value


def _check_code(entry_point: str | None, source_dir: str | None) -> tuple[str, Path | None]:
    if not entry_point:
        raise InvalidArgumentError("entry_point is required: the training script to run, e.g. "
                                   "entry_point='train.py' (relative to source_dir when given)",
                                   argument="entry_point")
    from shoal.endpoints._model import check_code

    checked, src = check_code(entry_point, source_dir)
    return str(checked), src


def _check_hyperparameters(hps: Mapping[str, Any] | None) -> dict[str, Any]:
    if hps is None:
        return {}
    if not isinstance(hps, Mapping):
        raise InvalidArgumentError("hyperparameters must be a dict", argument="hyperparameters")
    for key, value in hps.items():
        if not isinstance(key, str) or not _FLAG.match(key):
            raise InvalidArgumentError(
                f"hyperparameter name {key!r} cannot be a command-line flag (--{key}); use "
                "letters, digits, '_', '-' or '.', starting with a letter or '_'",
                argument="hyperparameters", key=str(key))
        try:
            json.dumps(value)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"hyperparameter {key!r}: value {value!r} is not JSON "
                                       f"serializable ({e})", key=key) from e
    return dict(hps)


def _check_metrics(defs: list[Mapping[str, str]] | None) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for d in defs or ():
        if not isinstance(d, Mapping) or not isinstance(d.get("Name"), str) or not d["Name"] \
                or not isinstance(d.get("Regex"), str):
            raise InvalidArgumentError(
                f'metric definition {d!r} must be {{"Name": "...", "Regex": "..."}}',
                argument="metric_definitions")
        try:
            compiled = re.compile(d["Regex"])
        except re.error as e:
            raise InvalidArgumentError(
                f"metric {d['Name']!r}: regex {d['Regex']!r} does not compile: {e}",
                argument="metric_definitions", metric=d["Name"]) from e
        if compiled.groups < 1:
            raise InvalidArgumentError(
                f"metric {d['Name']!r}: regex {d['Regex']!r} needs a capture group around the "
                "value, e.g. 'loss=([0-9.]+)'", argument="metric_definitions", metric=d["Name"])
        out.append({"Name": d["Name"], "Regex": d["Regex"]})
    return out


def _skip_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name.split("/") else info

