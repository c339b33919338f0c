"""``Model``: model data (+ optional inference code) that ``deploy()`` turns into an endpoint.

Everything that can be checked is checked before anything starts: the model data (when
local), the code, the requirements file, the instance type and count, the batching options.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.core.clock import RandomIdFactory
from shoal.core.endpoints import BatchingOptions, EndpointConfig, check_endpoint_name
from shoal.core.inert import given, report_inert
from shoal.core.resources import resolve_instance_type
from shoal.core.tags import normalise_tags
from shoal.endpoints._predictor import Predictor
from shoal.endpoints._service import EndpointService
from shoal.endpoints._staging import check_model_data, pack_code
from shoal.errors import InvalidArgumentError

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["Model"]

#: SageMaker settings with no meaning for an endpoint here, with SageMaker's defaults: a value
#: other than these (or None/False) is kept on the endpoint record and reported once.
_MODEL_INERT: dict[str, Any] = {
    "image_uri": None, "role": None, "vpc_config": None, "enable_network_isolation": None,
    "model_kms_key": None, "image_config": None, "code_location": None,
    "container_log_level": logging.INFO, "git_config": None, "resources": None,
    "additional_model_data_sources": None, "model_reference_arn": None,
    "inference_config_name": None, "framework_version": None, "py_version": None,
    "model_server_workers": None,
}
_DEPLOY_INERT: dict[str, Any] = {
    "accelerator_type": None, "kms_key": None, "data_capture_config": None,
    "async_inference_config": None, "serverless_inference_config": None,
    "model_data_download_timeout": None, "inference_recommendation_id": None,
    "explainer_config": None, "accept_eula": None, "endpoint_logging": False,
    "resources": None, "endpoint_type": "ModelBased", "inference_component_name": None,
    "routing_config": None, "model_reference_arn": None, "inference_ami_version": None,
}


def _session(session: object) -> Session:
    from shoal.session import Session, current

    return session if isinstance(session, Session) else current()


class Model:
    """A model to deploy: ``model_data`` is a local directory, a ``model.tar.gz``, a bare model
    file or any fsspec URL holding ``model.onnx``, ``model.joblib``, ``model.pt`` or
    ``code/inference.py``. *entry_point* / *source_dir* become the model's ``code/``.

    Example:
        >>> from shoal.model import Model                                   # doctest: +SKIP
        >>> predictor = Model(model_data="s3://bucket/job/output/model.tar.gz").deploy(  # doctest: +SKIP
        ...     initial_instance_count=2, endpoint_name="digits")
        >>> predictor.predict([[0.0] * 64])                                  # doctest: +SKIP
        >>> predictor.delete_endpoint()                                      # doctest: +SKIP
    """

    def __init__(
            self, image_uri: str | None = None,
            model_data: str | os.PathLike[str] | None = None, role: str | None = None,
            predictor_cls: Any = None, env: Mapping[str, str] | None = None,
            name: str | None = None, vpc_config: Mapping[str, Any] | None = None,
            sagemaker_session: Session | None = None, enable_network_isolation: bool | None = None,
            model_kms_key: str | None = None, image_config: Mapping[str, Any] | None = None,
            source_dir: str | None = None, code_location: str | None = None,
            entry_point: str | None = None, container_log_level: int = logging.INFO,
            dependencies: Any = None, git_config: Mapping[str, str] | None = None,
            resources: Any = None, additional_model_data_sources: Any = None,
            model_reference_arn: str | None = None, *,
            inference_config_name: str | None = None, framework_version: str | None = None,
            py_version: str | None = None, model_server_workers: int | None = None) -> None:
        args = dict(locals())
        if model_data is None:
            raise InvalidArgumentError(_missing_model_data(image_uri), argument="model_data")
        self.model_data = os.fspath(model_data)
        session = _session(sagemaker_session)
        if session.settings.server_url is None:
            # (through a team server a file:// model may be in its store, on its host: the
            # endpoint service checks it at deploy)
            check_model_data(self.model_data)
        self.image_uri = image_uri
        self.role = role
        self.inert = given(args, _MODEL_INERT)
        self.entry_point, self.source_dir = check_code(entry_point, source_dir)
        self.dependencies = dependencies
        self._requirements, self._dependency_dirs = _check_dependencies(dependencies)
        self.env = dict(env or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise InvalidArgumentError("env must map str to str", argument="env")
        self.name = name
        self.sagemaker_session = session
        self.predictor_cls = predictor_cls or Predictor
        self.endpoint_name: str | None = None
        #: requirement lines the server's environment installs before the model's own: a
        #: framework estimator's container pins (set by its create_model()/deploy()), so the
        #: model is served with the framework release that trained it.
        self.framework_requirements: tuple[str, ...] = ()

    def deploy(
            self, initial_instance_count: int | None = None, instance_type: str | None = None,
            serializer: Any = None, deserializer: Any = None,
            accelerator_type: str | None = None, endpoint_name: str | None = None,
            tags: Any = None, kms_key: str | None = None, wait: bool = True,
            data_capture_config: Any = None, async_inference_config: Any = None,
            serverless_inference_config: Any = None, volume_size: int | None = None,
            model_data_download_timeout: int | None = None,
            container_startup_health_check_timeout: float | None = None,
            inference_recommendation_id: str | None = None, explainer_config: Any = None,
            accept_eula: bool | None = None, endpoint_logging: bool = False,
            resources: Any = None, endpoint_type: Any = "ModelBased",
            managed_instance_scaling: Mapping[str, Any] | None = None,
            inference_component_name: str | None = None, routing_config: Any = None,
            model_reference_arn: str | None = None, inference_ami_version: str | None = None,
            update_endpoint: bool = False, *,
            batching: Mapping[str, Any] | BatchingOptions | None = None,
            port: int | None = None) -> Any:
        """Start an endpoint serving this model; return a ``Predictor`` for it.

        SageMaker v2's parameters in its order, then shoal's keyword-only ``batching`` and
        ``port``. With *wait* (the default) this returns once every instance answers
        ``/ping``, or raises ``EndpointFailedError`` with the reason (the server's traceback,
        a port in use, a model directory with nothing to serve...). *batching*
        (``{"max_batch_size": 8, "max_batch_delay_ms": 5}``) turns on the server's dynamic
        batching; *port* fixes the first instance's port (the next ones follow it).
        *managed_instance_scaling* (``{"Status": "ENABLED", "MinInstanceCount": 1,
        "MaxInstanceCount": 4}``, SageMaker's) lets an endpoint on Ray Serve scale between
        those bounds; the local backend keeps ``initial_instance_count`` instances. *tags* are
        kept on the endpoint's record; *volume_size* (GB) is checked against the free disk.
        Settings with no effect here (``data_capture_config``, ``serverless_inference_config``,
        ``kms_key``...) are kept on the record and reported once. *update_endpoint* with an
        *endpoint_name* that exists replaces that endpoint: its instances stop, then this
        model's start under the same name (there is no traffic shift between the two).
        """
        session = self.sagemaker_session
        inert = {**self.inert, **given(locals(), _DEPLOY_INERT)}
        instance_type = instance_type or "local"
        resolve_instance_type(instance_type)  # an unknown type fails here, naming the family
        low, high = EndpointConfig.parse_scaling(managed_instance_scaling)
        config = EndpointConfig(
            min_instances=low, max_instances=high,
            instance_count=1 if initial_instance_count is None else initial_instance_count,
            instance_type=instance_type, batching=BatchingOptions.parse(batching),
            env=self.env, port=port,
            startup_timeout_s=float(container_startup_health_check_timeout or 600),
            code=bool(self.entry_point or self.source_dir or self._dependency_dirs),
            entry_point=Path(self.entry_point).name if self.entry_point else None,
            requirements=self._requirements is not None or bool(self.framework_requirements),
            tags=tuple(normalise_tags(tags)), inert_settings=inert)
        name = check_endpoint_name(endpoint_name or self._endpoint_name())
        _check_volume(session, volume_size)
        report_inert(session.report_inert, inert, session.settings.backend, "endpoint")
        if update_endpoint:
            if endpoint_name is None:
                raise InvalidArgumentError("update_endpoint=True replaces an existing endpoint: "
                                           "give its endpoint_name", argument="endpoint_name")
            service = EndpointService.for_session(session)
            if service.find(name) is not None:
                service.delete(name)
        self._start(name, config, wait)
        predictor = self.predictor_cls(name, sagemaker_session=session)
        if serializer is not None:
            predictor.serializer = serializer
        if deserializer is not None:
            predictor.deserializer = deserializer
        return predictor

    def _start(self, name: str, config: EndpointConfig, wait: bool) -> None:
        requirements = self._serving_requirements()
        if requirements is None and self.sagemaker_session.settings.server_url is None:
            _check_server_installed(self.model_data)  # served from this environment
        service = EndpointService.for_session(self.sagemaker_session)
        with tempfile.TemporaryDirectory(prefix="shoal-code-") as tmp:
            archive = None
            if config.code:
                archive = Path(tmp) / "code.tar.gz"
                pack_code(archive, entry_point=self.entry_point, source_dir=self.source_dir,
                          dependencies=self._dependency_dirs)
            service.create(name, model_data=self.model_data, config=config,
                           code_archive=archive, requirements=requirements)
        self.endpoint_name = name
        if wait:
            service.wait(name)

    def bundle(self, target: str, path: str | os.PathLike[str], *, force: bool = False,
               **options: Any) -> Any:
        """Write a self-contained deployment bundle of this model for another platform.

        *target* is ``azure-functions``, ``aws-lambda``, ``container`` or ``asgi``; *path* a
        directory or a ``.zip``; *options* are ``shoal.bundles.BundleOptions`` fields (``route``,
        ``auth_level``, ``output_map``, ``output_key``, ``quantize``, ``samples``). Returns a
        ``shoal.bundles.BundleRecord``; ``shoal.bundles.verify_bundle(path)`` checks the bundle.
        """
        from shoal.bundles import build_bundle

        if self.entry_point or self.source_dir:
            raise InvalidArgumentError("a bundle serves the model file itself; this Model's "
                                       "inference code (entry_point/source_dir) would be lost: "
                                       "bundle a Model without it", argument="entry_point")
        return build_bundle(self.model_data, target=target, output=path, force=force,
                            session=self.sagemaker_session, **options)

    def _serving_requirements(self) -> str | None:
        """The framework's lines, then the model's own requirements file, or None."""
        own = self._requirements.read_text() if self._requirements else None
        if not self.framework_requirements:
            return own
        return "\n".join([*self.framework_requirements, *([own] if own else [])]) + "\n"

    def _endpoint_name(self) -> str:
        base = self.name or Path(self.model_data.rstrip("/")).name.split(".")[0] or "model"
        base = "".join(c if c.isalnum() else "-" for c in base).strip("-")[:40] or "model"
        return str(RandomIdFactory().job_name(base, datetime.now(UTC)))

    def delete_model(self) -> None:
        """Nothing to do: a shoal model has no record of its own."""

    def __repr__(self) -> str:
        return f"Model(model_data={self.model_data!r}, entry_point={self.entry_point!r})"


def _missing_model_data(image_uri: str | None) -> str:
    """The error for a Model without model_data; names the likely slip of the old order."""
    text = ("model_data is required: a model directory, a model.tar.gz or a URL, e.g. "
            "Model(model_data='model.tar.gz')")
    if image_uri is not None:
        text += (f". Model's first parameter is image_uri (SageMaker's order: Model(image_uri, "
                 f"model_data, role)), and {image_uri!r} was given there")
    return text


def _check_volume(session: Session, volume_size: int | None) -> None:
    """SageMaker's deploy ``volume_size`` (GB of storage per instance): here the instances share
    the session's disk; less free space than asked for is reported once."""
    if volume_size is None:
        return
    if not isinstance(volume_size, int) or isinstance(volume_size, bool) or volume_size < 1:
        raise InvalidArgumentError(f"volume_size must be a positive number of GB, got "
                                   f"{volume_size!r}", argument="volume_size")
    home = Path(session.home)
    where = home if home.exists() else Path.cwd()
    free_gb = shutil.disk_usage(where).free / 1e9
    if free_gb < volume_size:
        session.report_inert("deploy.volume_size", f"volume_size={volume_size} GB: only "
                             f"{free_gb:.0f} GB are free under {where}, the disk the endpoint's "
                             "instances share")


def check_code(entry_point: str | None,
               source_dir: str | None) -> tuple[str | None, Path | None]:
    """The entry point (resolved when it stands alone) and the source directory, checked."""
    src: Path | None = None
    if source_dir is not None:
        if "://" in str(source_dir) or str(source_dir).endswith((".tar.gz", ".tgz")):
            raise InvalidArgumentError(f"source_dir {source_dir} must be a local directory",
                                       argument="source_dir")
        src = Path(source_dir).expanduser().resolve()
        if not src.is_dir():
            raise InvalidArgumentError(f"source_dir {source_dir} is not a directory (looked "
                                       f"for {src})", argument="source_dir", path=str(src))
    if entry_point is None:
        return None, src
    if src is not None:
        if not (src / entry_point).is_file():
            raise InvalidArgumentError(f"entry_point {entry_point} is not in source_dir {src}",
                                       argument="entry_point", path=str(src / entry_point))
        return str(entry_point), src
    path = Path(entry_point).expanduser().resolve()
    if not path.is_file():
        raise InvalidArgumentError(f"entry_point {entry_point} does not exist (looked for "
                                   f"{path})", argument="entry_point", path=str(path))
    return str(path), None


def _check_server_installed(model_data: Any) -> None:
    """``MissingExtraError`` naming the extra when this environment lacks the model server's
    packages (the instance would only fail later, with a traceback in its log)."""
    from shoal._internal.extras import LLM_SERVER_MODULES, SERVER_MODULES, require

    where = Path(os.fspath(model_data)) if isinstance(model_data, str | os.PathLike) else None
    if where is not None and (where.name == "serving.properties"
                              or (where / "serving.properties").is_file()):
        require("llm", "an LLM endpoint", *LLM_SERVER_MODULES)
    else:
        require("serve", "an endpoint", *SERVER_MODULES)


def _check_dependencies(deps: Any) -> tuple[Path | None, Sequence[Path]]:
    """A requirements file (the model's own environment), or SageMaker's list of directories
    to ship beside the code."""
    if deps is None:
        return None, ()
    if isinstance(deps, str | os.PathLike):
        path = Path(deps).expanduser().resolve()
        if not path.is_file():
            raise InvalidArgumentError(f"dependencies file {deps} does not exist (looked for "
                                       f"{path})", argument="dependencies")
        return path, ()
    if not isinstance(deps, list | tuple):
        raise InvalidArgumentError("dependencies must be a requirements file, or a list of "
                                   "directories to ship in code/", argument="dependencies")
    dirs = []
    for d in deps:
        path = Path(d).expanduser().resolve()
        if not path.exists():
            raise InvalidArgumentError(f"dependency {d} does not exist", argument="dependencies")
        dirs.append(path)
    return None, tuple(dirs)
