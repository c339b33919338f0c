"""``Model``: model data (+ optional inference code) that ``deploy()`` turns into an endpoint.

Everything that can be checked is checked before anything starts: the model data (when
local), the code, the requirements file, the instance type and count, the batching options.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shoal.core.clock import RandomIdFactory
from shoal.core.endpoints import BatchingOptions, EndpointConfig, check_endpoint_name
from shoal.core.resources import resolve_instance_type
from shoal.endpoints._predictor import Predictor
from shoal.endpoints._service import EndpointService
from shoal.endpoints._staging import check_model_data, pack_code
from shoal.errors import InvalidArgumentError

__all__ = ["Model"]

# SageMaker arguments that mean nothing for a local endpoint: accepted and kept.
_MODEL_INERT = ("vpc_config", "enable_network_isolation", "model_kms_key", "image_config",
                "code_location", "container_log_level", "git_config", "resources",
                "additional_model_data_sources", "model_reference_arn",
                "inference_config_name", "framework_version", "py_version")
_DEPLOY_INERT = ("accelerator_type", "tags", "kms_key", "data_capture_config",
                 "async_inference_config", "serverless_inference_config", "volume_size",
                 "model_data_download_timeout", "inference_recommendation_id",
                 "explainer_config", "accept_eula", "endpoint_logging", "resources",
                 "endpoint_type", "inference_component_name",
                 "routing_config", "model_reference_arn", "update_endpoint")


def _session(given: Any) -> Any:
    from shoal.session import Session, current

    return given if isinstance(given, Session) else current()


class Model:
    """A model to deploy: ``model_data`` is a local directory, a ``model.tar.gz``, a bare model
    file or any fsspec URL holding ``model.onnx``, ``model.joblib``, ``model.pt`` or
    ``code/inference.py``. *entry_point* / *source_dir* become the model's ``code/``.

    Example:
        >>> from shoal.model import Model                                   # doctest: +SKIP
        >>> predictor = Model("s3://bucket/job/output/model.tar.gz").deploy( # doctest: +SKIP
        ...     initial_instance_count=2, endpoint_name="digits")
        >>> predictor.predict([[0.0] * 64])                                  # doctest: +SKIP
        >>> predictor.delete_endpoint()                                      # doctest: +SKIP
    """

    def __init__(self, model_data: str | os.PathLike[str] | None = None,
                 image_uri: str | None = None, role: str | None = None,
                 entry_point: str | None = None, source_dir: str | None = None,
                 dependencies: Any = None, env: Mapping[str, str] | None = None,
                 name: str | None = None, sagemaker_session: Any = None,
                 predictor_cls: Any = None, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(_MODEL_INERT))
        if unknown:
            raise InvalidArgumentError(f"unknown Model argument(s) {', '.join(unknown)}",
                                       arguments=unknown)
        if model_data is None:
            raise InvalidArgumentError("model_data is required: a model directory, a "
                                       "model.tar.gz or a URL", argument="model_data")
        self.model_data = os.fspath(model_data)
        check_model_data(self.model_data)
        self.image_uri = image_uri
        self.role = role
        self.inert = {k: v for k, v in kwargs.items() if v is not None}
        self.entry_point, self.source_dir = check_code(entry_point, source_dir)
        self.dependencies = dependencies
        self._requirements, self._dependency_dirs = _check_dependencies(dependencies)
        self.env = dict(env or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise InvalidArgumentError("env must map str to str", argument="env")
        self.name = name
        self.sagemaker_session = _session(sagemaker_session)
        self.predictor_cls = predictor_cls or Predictor
        self.endpoint_name: str | None = None
        #: requirement lines the server's environment installs before the model's own: a
        #: framework estimator's container pins (set by its create_model()/deploy()), so the
        #: model is served with the framework release that trained it.
        self.framework_requirements: tuple[str, ...] = ()

    def deploy(self, initial_instance_count: int | None = None,
               instance_type: str | None = None, serializer: Any = None,
               deserializer: Any = None, endpoint_name: str | None = None,
               wait: bool = True, batching: Mapping[str, Any] | BatchingOptions | None = None,
               port: int | None = None,
               container_startup_health_check_timeout: float | None = None,
               managed_instance_scaling: Mapping[str, Any] | None = None,
               **kwargs: Any) -> Any:
        """Start an endpoint serving this model; return a ``Predictor`` for it.

        With *wait* (the default) this returns once every instance answers ``/ping``, or
        raises ``EndpointFailedError`` with the reason (the server's traceback, a port in use,
        a model directory with nothing to serve...). *batching* (``{"max_batch_size": 8,
        "max_batch_delay_ms": 5}``) turns on the server's dynamic batching; *port* fixes the
        first instance's port (the next ones follow it). *managed_instance_scaling*
        (``{"Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 4}``, SageMaker's)
        lets an endpoint on Ray Serve scale between those bounds; the local backend keeps
        ``initial_instance_count`` instances.
        """
        unknown = sorted(set(kwargs) - set(_DEPLOY_INERT))
        if unknown:
            raise InvalidArgumentError(f"unknown deploy argument(s) {', '.join(unknown)}",
                                       arguments=unknown)
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
            requirements=self._requirements is not None or bool(self.framework_requirements))
        name = check_endpoint_name(endpoint_name or self._endpoint_name())
        service = EndpointService(self.sagemaker_session)
        requirements = self._serving_requirements()
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
        predictor = self.predictor_cls(name, sagemaker_session=self.sagemaker_session)
        if serializer is not None:
            predictor.serializer = serializer
        if deserializer is not None:
            predictor.deserializer = deserializer
        return predictor

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
