"""``Estimator`` and its framework flavours: script-mode training jobs under SageMaker's names.

``fit()`` checks everything it can before anything starts (entry point, channels, metric
regexes, hyperparameter names), packs ``source_dir`` as ``sourcedir.tar.gz`` in the job's
prefix and submits a script job; the supervisor lays out the SageMaker container directory and
runs the script with the ``SM_*`` contract (``shoal/jobs/_training.py``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from shoal.core.inert import given, report_inert
from shoal.core.jobs import JobKind, JobSpec, JobStatus, RunRef, TrainingSpec
from shoal.core.tags import normalise_tags
from shoal.errors import InvalidArgumentError
from shoal.image_uris import parse_image_uri
from shoal.jobs.options import JobOptions, explicit_sources, job_spec, new_job_name
from shoal.training._checks import check_code, check_hyperparameters, check_metrics, positive
from shoal.training._inputs import (
    UploadProgress,
    check_input_mode,
    local_files,
    resolve_channels,
    ship_local_channels,
)
from shoal.training._job import TrainingJob
from shoal.training.models import VPC_CONFIG_DEFAULT, vpc_config

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["Estimator", "TrainingJob"]

T = TypeVar("T")
_JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_OPT_ML_CHECKPOINTS = "/opt/ml/checkpoints"
#: SageMaker settings with no meaning here, with SageMaker's defaults: a value other than the
#: default (or None/False) is kept on the job record and reported once (shoal.core.inert).
_INERT: dict[str, Any] = {
    "image_uri": None, "role": None, "volume_kms_key": None, "output_kms_key": None,
    "subnets": None, "security_group_ids": None, "encrypt_inter_container_traffic": None,
    "use_spot_instances": False, "max_wait": None, "enable_network_isolation": None,
    "rules": None, "debugger_hook_config": None, "tensorboard_output_config": None,
    "profiler_config": None, "git_config": None, "container_log_level": logging.INFO,
    "code_location": None, "instance_groups": None, "training_repository_access_mode": None,
    "training_repository_credentials_provider_arn": None, "enable_infra_check": None,
    "container_entry_point": None, "container_arguments": None,
    "disable_output_compression": False, "enable_remote_debug": None,
    "enable_session_tag_chaining": None, "training_plan": None,
    "instance_placement_config": None,
    # the framework estimators' own
    "compiler_config": None, "training_recipe": None, "recipe_overrides": None,
    "image_uri_region": None,
}


#: Estimator's names of the job options whose @remote names differ (for the errors).
_SAGEMAKER_NAMES = {"max_runtime_in_seconds": "max_run", "environment_variables": "environment"}


class _FromOptions(Generic[T]):
    """An estimator attribute that is one of its ``job_options`` (read-only)."""

    def __init__(self, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, est: None, owner: type) -> _FromOptions[T]: ...
    @overload
    def __get__(self, est: Estimator, owner: type | None = None) -> T: ...

    def __get__(self, est: Estimator | None, owner: type | None = None
                ) -> T | _FromOptions[T]:
        if est is None:  # on the class, as a property is
            return self
        value: T = getattr(est.job_options, self._name)
        return value


def _session(given: object) -> Session:
    from shoal.session import Session, current

    return given if isinstance(given, Session) else current()


def _passed(args: dict[str, Any], *drop: str) -> dict[str, Any]:
    """A subclass's ``locals()`` as keyword arguments for its base's ``__init__``."""
    return {k: v for k, v in args.items() if k not in ("self", "__class__", *drop)}


class Estimator:
    """A script-mode training job, configured once and run with ``fit()``.

    The parameters are SageMaker v2's ``Estimator``'s, in its order (``image_uri``, ``role``,
    ``instance_count``, ``instance_type``, ...), then shoal's own keyword-only ones
    (``distribution``, ``allow_cpu_fallback``). Settings with no meaning here (``role``,
    ``subnets``, ``use_spot_instances``...) are kept on the job record and reported once;
    docs/sagemaker-compat.md lists what each does.

    Example:
        >>> from shoal.estimator import Estimator                    # doctest: +SKIP
        >>> est = Estimator(entry_point="train.py", source_dir="src",  # doctest: +SKIP
        ...                 hyperparameters={"epochs": 2},
        ...                 metric_definitions=[{"Name": "loss", "Regex": "loss=([0-9.]+)"}])
        >>> est.fit({"training": "data/train"})                        # doctest: +SKIP
        >>> est.model_data                                             # doctest: +SKIP
    """

    _framework: tuple[str, str] | None = None  # (distribution, version pin) of a framework

    def __init__(
            self, image_uri: str | None = None, role: str | None = None,
            instance_count: int | None = 1, instance_type: str | None = None,
            keep_alive_period_in_seconds: float | None = None, volume_size: int = 30,
            volume_kms_key: str | None = None, max_run: int = 24 * 60 * 60,
            input_mode: str = "File", output_path: str | None = None,
            output_kms_key: str | None = None, base_job_name: str | None = None,
            sagemaker_session: Session | None = None, hyperparameters: Mapping[str, Any] | None = None,
            tags: Any = None, subnets: list[str] | None = None,
            security_group_ids: list[str] | None = None, model_uri: str | None = None,
            model_channel_name: str = "model",
            metric_definitions: list[Mapping[str, str]] | None = None,
            encrypt_inter_container_traffic: bool | None = None,
            use_spot_instances: bool = False, max_wait: int | None = None,
            checkpoint_s3_uri: str | None = None, checkpoint_local_path: str | None = None,
            enable_network_isolation: bool | None = None, rules: Any = None,
            debugger_hook_config: Any = None, tensorboard_output_config: Any = None,
            enable_sagemaker_metrics: bool | None = None, profiler_config: Any = None,
            disable_profiler: bool = False, environment: Mapping[str, str] | None = None,
            max_retry_attempts: int | None = None, source_dir: str | None = None,
            git_config: Mapping[str, str] | None = None,
            container_log_level: int = logging.INFO, code_location: str | None = None,
            entry_point: str | None = None, dependencies: Any = None,
            instance_groups: Any = None, training_repository_access_mode: str | None = None,
            training_repository_credentials_provider_arn: str | None = None,
            container_entry_point: list[str] | None = None,
            container_arguments: list[str] | None = None,
            disable_output_compression: bool = False, enable_infra_check: bool | None = None,
            enable_remote_debug: bool | None = None,
            enable_session_tag_chaining: bool | None = None, training_plan: str | None = None,
            instance_placement_config: Any = None, *,
            distribution: Mapping[str, Any] | None = None,
            allow_cpu_fallback: bool = False) -> None:
        self._configure(_passed(locals()))

    def _configure(self, a: dict[str, Any]) -> None:
        """Check and keep every setting (``a``: the constructor's arguments by name)."""
        self.sagemaker_session = _session(a["sagemaker_session"])
        self.inert = given(a, _INERT)
        image = parse_image_uri(a["image_uri"])  # image_uris.retrieve's URI names a framework
        if image is not None:
            self.inert.pop("image_uri", None)
        self._framework = self._framework or (image.requirement if image else None)
        self.entry_point, self.source_dir = check_code(a["entry_point"], a["source_dir"])
        self.hyperparameters_ = check_hyperparameters(a["hyperparameters"])
        self.metric_definitions = check_metrics(a["metric_definitions"])
        self.job_options = JobOptions(
            instance_type=a["instance_type"] or "local", instance_count=a["instance_count"] or 1,
            keep_alive_period_in_seconds=a["keep_alive_period_in_seconds"] or 0,
            max_runtime_in_seconds=a["max_run"],
            max_retry_attempts=a["max_retry_attempts"] or 1,
            allow_cpu_fallback=a["allow_cpu_fallback"],
            environment_variables=a["environment"] or {}, tags=tuple(normalise_tags(a["tags"])),
            names=_SAGEMAKER_NAMES)
        self.job_options.resources()  # an unknown type, or GPUs this machine lacks: now
        self.volume_size = positive(a["volume_size"], "volume_size")
        self.input_mode = check_input_mode(a["input_mode"] or "File")
        self.output_path = a["output_path"].rstrip("/") if a["output_path"] else None
        self.base_job_name = a["base_job_name"]
        self.model_uri, self.model_channel_name = a["model_uri"], a["model_channel_name"]
        cp = a["checkpoint_s3_uri"]
        self.checkpoint_s3_uri = cp.rstrip("/") if cp else None
        self.checkpoint_local_path = a["checkpoint_local_path"]
        self.dependencies = a["dependencies"]
        self._requirements = self._requirements_file()
        self.distribution = dict(a["distribution"] or {})
        self._torchrun = self._check_distribution()
        self.latest_training_job: TrainingJob | None = None
        self._current_job_name: str | None = None

    # --- validation -------------------------------------------------------------------

    # SageMaker's Estimator attributes, read from the job options
    instance_type = _FromOptions[str]("instance_type")
    instance_count = _FromOptions[int]("instance_count")
    keep_alive_period_in_seconds = _FromOptions[float]("keep_alive_period_in_seconds")
    max_run = _FromOptions[int]("max_runtime_in_seconds")
    max_retry_attempts = _FromOptions[int]("max_retry_attempts")
    allow_cpu_fallback = _FromOptions[bool]("allow_cpu_fallback")
    environment = _FromOptions[Mapping[str, str]]("environment_variables")
    tags = _FromOptions[tuple[tuple[str, str], ...]]("tags")

    def _check_distribution(self) -> bool:
        """Whether the distribution asks for torchrun (the only one there is)."""
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
        return torchrun

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
        self.hyperparameters_ = check_hyperparameters({**self.hyperparameters_, **kwargs})

    @property
    def _output_root(self) -> str:
        return self.output_path or str(self.sagemaker_session.artifacts.root)

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

    def fit(self, inputs: Any = None, wait: bool = True, logs: bool | str = "All",
            job_name: str | None = None, experiment_config: Mapping[str, str] | None = None
            ) -> None:
        """Check the inputs, submit the training job and (with *wait*) follow it to its end,
        printing its log unless *logs* is False or ``"None"``."""
        session = self.sagemaker_session
        remote = session.settings.server_url is not None
        channels = resolve_channels(self._with_model_channel(inputs),
                                    input_mode=self.input_mode,
                                    store=session.artifacts if remote else None)
        if remote:
            self._check_remote_outputs(session)
        name = self._job_name(job_name)
        run = self._run_context(experiment_config)
        self._check_volume(session)
        with tempfile.TemporaryDirectory(prefix="shoal-src-") as tmp:
            archive = Path(tmp) / "sourcedir.tar.gz"
            self._pack(archive)
            files: dict[str, bytes | Path] = {"source/sourcedir.tar.gz": archive}
            requirements = self._env_requirements()
            if requirements is not None:
                files["env/requirements.txt"] = requirements.encode()
            if remote:  # the job runs on the server's host: what it reads from here goes up
                files.update(self._client_files(name, channels, session))
            spec = self._spec(name, channels, session, run, requirements)
            record = session.jobs.submit_script(spec, files,
                                                on_file=UploadProgress(name, files))
        if run is not None:
            session.runs.link_run_job(run.experiment_name, run.run_name, name)
        self.latest_training_job = TrainingJob(self, record.name)
        self._current_job_name = record.name
        if wait:
            self.latest_training_job.wait(logs=logs not in (False, None, "None"))

    def _client_files(self, name: str, channels: dict[str, Any],
                      session: Session) -> dict[str, Path]:
        """Through a team server: the files on this machine the job reads (its channels'
        local data), to upload under the job's prefix; the channels then name them there."""
        return ship_local_channels(channels, name, session.artifacts)

    def _check_remote_outputs(self, session: Session) -> None:
        """Through a team server the job runs on its host: an output or checkpoint location
        on this machine would be a path of that host's; refused, saying what to give."""
        root = session.artifacts.root.rstrip("/") + "/"
        for setting, value in (("output_path", self.output_path),
                               ("checkpoint_s3_uri", self.checkpoint_s3_uri)):
            if not value:
                continue
            local = "://" not in value or value.startswith("file://")
            if local and not (value.rstrip("/") + "/").startswith(root):
                raise InvalidArgumentError(
                    f"{setting}={value!r} is a path on this machine, but through a team server "
                    f"the job runs on the server's host and would write there instead; leave "
                    f"{setting} unset (the job's files go under its prefix in the server's "
                    f"store, {session.artifacts.root}) or give a URL the server writes to (in "
                    "its store, or s3://...)", argument=setting, value=value)

    @staticmethod
    def _ship_path(name: str, path: Path, rel: str, what: str,
                   session: Session) -> tuple[str, dict[str, Path]]:
        """The files of a local *path* the job reads, to go up under ``<name>/<rel>/``, and
        the store URI the job then reads them at (a directory's prefix, or the file)."""
        from shoal.storage.artifacts import job_key

        where, files = local_files(path, rel, what)
        return session.artifacts.uri(job_key(name, *where.split("/"))), files

    def _with_model_channel(self, inputs: Any) -> Any:
        """SageMaker's ``model_uri``: one more channel, ``model_channel_name`` ("model")."""
        if not self.model_uri:
            return inputs
        if inputs is None:
            inputs = {}
        elif not isinstance(inputs, dict):
            inputs = {"training": inputs}
        if self.model_channel_name in inputs:
            raise InvalidArgumentError(
                f"channel {self.model_channel_name!r} is given twice: by model_uri and in fit()'s"
                " inputs; rename one (model_channel_name=...)", channel=self.model_channel_name)
        return {**inputs, self.model_channel_name: self.model_uri}

    def _check_volume(self, session: Session) -> None:
        """SageMaker's ``volume_size`` (GB) is a disk of the job's own; here the job shares the
        session's disk, so a size larger than what is free there is reported once."""
        if self.volume_size == 30:  # SageMaker's default: nobody asked for anything
            return
        home = Path(session.home)
        where = home if home.exists() else Path.cwd()
        free_gb = shutil.disk_usage(where).free / 1e9
        if free_gb < self.volume_size:
            session.report_inert("volume_size", f"volume_size={self.volume_size} GB: only "
                                 f"{free_gb:.0f} GB are free under {where}, the disk this "
                                 "job's data, checkpoints and output share")

    def _job_name(self, given: str | None) -> str:
        if given is not None:
            if not _JOB_NAME.match(given):
                raise InvalidArgumentError(f"job_name {given!r} must be 1-63 letters, digits or "
                                           "hyphens, starting with a letter or digit",
                                           argument="job_name")
            return given
        return new_job_name(self.base_job_name or Path(self.entry_point).stem or "training")

    @staticmethod
    def _run_context(experiment_config: Mapping[str, str] | None) -> RunRef | None:
        if experiment_config:
            exp = experiment_config.get("ExperimentName")
            run = experiment_config.get("RunName") or experiment_config.get("TrialName")
            if exp and run:
                return RunRef(exp, run)
        from shoal.experiments import current_run_context

        context = current_run_context()
        return None if context is None else RunRef.from_json(context)

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

    def _spec(self, name: str, channels: dict[str, Any], session: Session,
              run: RunRef | None, requirements: str | None) -> JobSpec:
        inert = dict(self.inert)  # and the channels' own (TrainingInput(hub_access_config=...))
        for channel in channels.values():
            inert.update(channel.pop("inert", {}))
        training = TrainingSpec(
            entry_point=Path(self.entry_point).as_posix() if self.source_dir else
            Path(self.entry_point).name,
            source_key=f"{name}/source/sourcedir.tar.gz",
            source_uri=session.artifacts.uri(f"{name}/source/sourcedir.tar.gz"),
            hyperparameters=dict(self.hyperparameters_), channels=channels,
            output_path=self.output_path, output_root=self._output_root,
            metric_definitions=tuple(dict(d) for d in self.metric_definitions),
            checkpoint_s3_uri=self.checkpoint_s3_uri,
            checkpoint_local_path=self.checkpoint_local_path or _OPT_ML_CHECKPOINTS,
            instance_count=self.instance_count, volume_size=self.volume_size,
            input_mode=self.input_mode, distribution_config=self.distribution,
            framework=self._framework, framework_module=self._framework_module(),
            estimator=type(self).__name__)
        notices = tuple(getattr(self, "_framework_notices", ()))
        for notice in notices:  # on the record, and warned once
            session.report_inert(f"framework:{notice}", notice)
        report_inert(session.report_inert, inert, session.settings.backend, "job")
        deps = None
        if requirements is not None:
            deps = str(self._requirements or (self.source_dir or Path.cwd()) / "requirements.txt")
        return job_spec(
            self.job_options, session.settings, name=name, kind=JobKind.SCRIPT,
            function_name=training.entry_point,
            distribution=self.job_options.ranks(torchrun=self._torchrun),
            dependencies=deps, inert_settings=inert, run=run,
            # as in SageMaker's containers: import sagemaker
            sagemaker_alias=self._framework is not None,
            strict_versions=bool(getattr(self, "strict_versions",
                                         session.settings.strict_versions)),
            training=training, framework_notices=notices,
            option_sources=explicit_sources(self.job_options))

    def _framework_module(self) -> str:
        return ""

    @classmethod
    def attach(cls, training_job_name: str, sagemaker_session: Session | None = None,
               model_channel_name: str = "model") -> Estimator:
        """An estimator for an existing training job; waits for it when it is still running."""
        session = _session(sagemaker_session)
        # Its secret variables are stored encrypted: decrypted with the job's key.
        record = session.jobs.unseal(session.jobs.get(training_job_name))
        spec = record.spec
        cfg = spec.training
        if spec.kind != JobKind.SCRIPT or cfg is None:
            raise InvalidArgumentError(f"job {training_job_name} is not a training job (it runs "
                                       f"{spec.kind} {spec.function_name})",
                                       job=training_job_name)
        est = cls.__new__(cls)
        est.sagemaker_session = session
        est.inert = dict(spec.inert_settings)
        est.entry_point = cfg.entry_point
        est.source_dir = None
        est.hyperparameters_ = dict(cfg.hyperparameters)
        est.metric_definitions = [dict(d) for d in cfg.metric_definitions]
        est.job_options = JobOptions(
            instance_type=spec.instance_type or "local", instance_count=cfg.instance_count,
            keep_alive_period_in_seconds=spec.keep_alive_period_in_seconds,
            max_runtime_in_seconds=spec.max_runtime_in_seconds,
            max_retry_attempts=spec.max_retry_attempts,
            allow_cpu_fallback=spec.allow_cpu_fallback,
            stop_grace_period_in_seconds=spec.stop_grace_period_in_seconds,
            environment_variables=spec.environment_variables, tags=spec.tags,
            names=_SAGEMAKER_NAMES)
        est.volume_size = cfg.volume_size
        est.input_mode = cfg.input_mode
        est.model_uri, est.model_channel_name = None, model_channel_name
        est.output_path = cfg.output_path
        est.base_job_name = None
        est.checkpoint_s3_uri = cfg.checkpoint_s3_uri
        est.checkpoint_local_path = cfg.checkpoint_local_path
        est.dependencies = None
        est._requirements = None
        est.distribution = dict(cfg.distribution_config)
        est._torchrun = bool(spec.distribution and spec.distribution.torchrun)
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

    def create_model(self, role: str | None = None, image_uri: str | None = None,
                     predictor_cls: Any = None, vpc_config_override: Any = VPC_CONFIG_DEFAULT,
                     *, entry_point: str | None = None, source_dir: str | None = None,
                     dependencies: Any = None, env: Mapping[str, str] | None = None,
                     name: str | None = None, model_server_workers: int | None = None) -> Any:
        """A ``Model`` of the latest training job's ``model_data`` (SageMaker's
        ``Estimator.create_model``); *entry_point* / *source_dir* become its inference code."""
        from shoal.endpoints import Model

        model = Model(image_uri, self.model_data, role, predictor_cls, env, name,
                      vpc_config(vpc_config_override), self.sagemaker_session,
                      source_dir=source_dir, entry_point=entry_point, dependencies=dependencies,
                      model_server_workers=model_server_workers)
        # served with the framework the job trained with, as in SageMaker's framework container
        model.framework_requirements = self._serving_framework()
        return model

    def deploy(self, initial_instance_count: int | None = None,
               instance_type: str | None = None, serializer: Any = None,
               deserializer: Any = None, accelerator_type: str | None = None,
               endpoint_name: str | None = None, use_compiled_model: bool = False,
               wait: bool = True, model_name: str | None = None, kms_key: str | None = None,
               data_capture_config: Any = None, tags: Any = None,
               serverless_inference_config: Any = None, async_inference_config: Any = None,
               volume_size: int | None = None, model_data_download_timeout: int | None = None,
               container_startup_health_check_timeout: int | None = None,
               inference_recommendation_id: str | None = None, explainer_config: Any = None,
               *, role: str | None = None, image_uri: str | None = None,
               predictor_cls: Any = None, vpc_config_override: Any = VPC_CONFIG_DEFAULT,
               entry_point: str | None = None, source_dir: str | None = None,
               dependencies: Any = None, env: Mapping[str, str] | None = None,
               model_server_workers: int | None = None,
               accept_eula: bool | None = None, endpoint_logging: bool = False,
               resources: Any = None, endpoint_type: Any = None,
               managed_instance_scaling: Mapping[str, Any] | None = None,
               inference_component_name: str | None = None, routing_config: Any = None,
               model_reference_arn: str | None = None, inference_ami_version: str | None = None,
               batching: Any = None, port: int | None = None) -> Any:
        """Serve the latest training job's ``model_data`` on an endpoint (named after the job
        unless *endpoint_name* is given); return its ``Predictor``.

        SageMaker's parameters in its order; the keyword-only ones are what SageMaker passes on
        to ``create_model()`` (``role``, ``entry_point``, ``source_dir``, ``dependencies``,
        ``env``...) and to ``Model.deploy`` (``managed_instance_scaling``...), then shoal's
        ``batching`` and ``port``. The estimator's ``tags`` apply when none are given."""
        if use_compiled_model:
            raise InvalidArgumentError(
                "use_compiled_model=True deploys a model made by compile_model() (SageMaker Neo),"
                " which shoal does not provide; deploy the trained model without it",
                argument="use_compiled_model")
        given = {"role": role, "image_uri": image_uri, "predictor_cls": predictor_cls,
                 "entry_point": entry_point, "source_dir": source_dir,
                 "dependencies": dependencies, "env": env, "name": model_name,
                 "model_server_workers": model_server_workers}
        # by name: a framework estimator's create_model() has its own order (PyTorch's)
        model = self.create_model(vpc_config_override=vpc_config_override,
                                  **{k: v for k, v in given.items() if v is not None})
        return model.deploy(
            initial_instance_count, instance_type, serializer, deserializer, accelerator_type,
            endpoint_name or self._require_job().name, tags or list(self.tags) or None,
            kms_key, wait, data_capture_config, async_inference_config,
            serverless_inference_config, volume_size, model_data_download_timeout,
            container_startup_health_check_timeout, inference_recommendation_id,
            explainer_config, accept_eula, endpoint_logging, resources, endpoint_type,
            managed_instance_scaling, inference_component_name, routing_config,
            model_reference_arn, inference_ami_version, batching=batching, port=port)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(entry_point={self.entry_point!r}, "
                f"instance_type={self.instance_type!r}, instance_count={self.instance_count})")


def _skip_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name.split("/") else info

