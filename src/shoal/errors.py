"""Every exception shoal raises, in one tree.

    ShoalError
    ├── ConfigError
    │   └── MissingExtraError        a feature's optional packages are not installed (also an
    │                                ImportError); names the extra: pip install "shoal[...]"
    ├── InvalidArgumentError (also ValueError)
    ├── NotFoundError
    │   ├── JobNotFound
    │   ├── RunNotFound
    │   ├── ExperimentNotFound
    │   ├── ModelNotFound
    │   ├── EndpointNotFound
    │   └── ArtifactNotFound
    ├── AlreadyExistsError
    ├── ConflictError
    │   └── InvalidTransitionError
    ├── StorageError
    │   ├── ArtifactStoreError
    │   │   └── InvalidArtifactKeyError  a key with "..", absolute or empty (400; also an
    │   │                                InvalidArgumentError)
    │   └── MetadataStoreError
    │       └── SchemaOutOfDateError
    ├── SerializationError
    │   ├── PicklingError            an object the job needs cannot be pickled
    │   │                            (also an InvalidArgumentError)
    │   ├── PayloadVersionError
    │   └── PayloadIntegrityError
    ├── RuntimeEnvError
    ├── BackendError
    │   ├── BackendUnavailableError
    │   ├── LaunchError
    │   └── ResourceUnavailableError  the instance type asks for what this machine lacks
    ├── JobError
    │   ├── JobFailedError
    │   ├── JobCancelledError
    │   └── JobTimeoutError
    ├── ModelExportError           a model could not be exported (to ONNX)
    │   └── ModelVerificationError the exported model does not answer like its source
    ├── ServingError
    │   ├── ModelLoadError
    │   ├── OverloadedError
    │   ├── EndpointFailedError      an endpoint could not start (or stay) in service
    │   ├── EndpointNotInServiceError  503: a team server asked to invoke one not in service
    │   ├── EndpointUnreachableError   502: a team server could not reach its model server
    │   └── InvocationError          a model server answered a request with 4xx/5xx
    ├── ApiError                     a team server's answer could not be used
    ├── PayloadTooLargeError         413: an upload past the team server's size limit
    ├── AuthenticationError          401: no valid token
    └── PermissionDeniedError        403: the token's scope does not allow the action

Each class has one ``code`` (its wire name) and an ``http_status``; ``details`` carries
structured context (job names, paths, keys). Every error pickles, so it can cross a process.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AlreadyExistsError",
    "ApiError",
    "ArtifactNotFound",
    "ArtifactStoreError",
    "AuthenticationError",
    "BackendError",
    "BackendUnavailableError",
    "ConfigError",
    "ConflictError",
    "EndpointFailedError",
    "EndpointNotFound",
    "EndpointNotInServiceError",
    "EndpointUnreachableError",
    "ExperimentNotFound",
    "InvalidArgumentError",
    "InvalidArtifactKeyError",
    "InvalidTransitionError",
    "InvocationError",
    "JobCancelledError",
    "JobError",
    "JobFailedError",
    "JobNotFound",
    "JobTimeoutError",
    "LaunchError",
    "MetadataStoreError",
    "MissingExtraError",
    "ModelExportError",
    "ModelLoadError",
    "ModelNotFound",
    "ModelVerificationError",
    "NotFoundError",
    "OverloadedError",
    "PayloadIntegrityError",
    "PayloadTooLargeError",
    "PayloadVersionError",
    "PermissionDeniedError",
    "PicklingError",
    "ResourceUnavailableError",
    "RunNotFound",
    "RuntimeEnvError",
    "SchemaOutOfDateError",
    "SerializationError",
    "ServerUnreachableError",
    "ServingError",
    "ShoalError",
    "StorageError",
    "error_class_for_code",
]


class ShoalError(Exception):
    """Base of every shoal error."""

    code: ClassVar[str] = "INTERNAL_ERROR"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword details do not survive BaseException's default reduce.
        return (_rebuild, (type(self), self.message, self.details))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[ShoalError], message: str, details: dict[str, Any]) -> ShoalError:
    return cls(message, **details)


class ConfigError(ShoalError):
    code = "CONFIG_ERROR"
    http_status = 400


class MissingExtraError(ConfigError, ImportError):
    """A feature needs a package its extra brings: ``details`` has ``extra``, ``module`` and
    ``feature``. Also an ``ImportError``, so code probing for an optional package still works."""

    code = "MISSING_EXTRA"
    http_status = 500


class InvalidArgumentError(ShoalError, ValueError):
    code = "INVALID_ARGUMENT"
    http_status = 400


class NotFoundError(ShoalError):
    code = "NOT_FOUND"
    http_status = 404


class JobNotFound(NotFoundError):
    code = "JOB_NOT_FOUND"


class RunNotFound(NotFoundError):
    code = "RUN_NOT_FOUND"


class ExperimentNotFound(NotFoundError):
    code = "EXPERIMENT_NOT_FOUND"


class ModelNotFound(NotFoundError):
    code = "MODEL_NOT_FOUND"


class EndpointNotFound(NotFoundError):
    code = "ENDPOINT_NOT_FOUND"


class ArtifactNotFound(NotFoundError):
    code = "ARTIFACT_NOT_FOUND"


class AlreadyExistsError(ShoalError):
    code = "ALREADY_EXISTS"
    http_status = 409


class ConflictError(ShoalError):
    code = "CONFLICT"
    http_status = 409


class InvalidTransitionError(ConflictError):
    code = "INVALID_TRANSITION"


class StorageError(ShoalError):
    code = "STORAGE_ERROR"
    http_status = 503


class ArtifactStoreError(StorageError):
    code = "ARTIFACT_STORE_ERROR"


class InvalidArtifactKeyError(ArtifactStoreError, InvalidArgumentError):
    """A key that would leave the store's root (``..``, absolute) or names nothing."""

    code = "INVALID_ARTIFACT_KEY"
    http_status = 400


class MetadataStoreError(StorageError):
    code = "METADATA_STORE_ERROR"


class SchemaOutOfDateError(MetadataStoreError):
    code = "SCHEMA_OUT_OF_DATE"


class SerializationError(ShoalError):
    code = "SERIALIZATION_ERROR"
    http_status = 400


class PicklingError(SerializationError, InvalidArgumentError):
    code = "NOT_PICKLABLE"
    http_status = 400


class PayloadVersionError(SerializationError):
    code = "PAYLOAD_VERSION"


class PayloadIntegrityError(SerializationError):
    code = "PAYLOAD_INTEGRITY"


class RuntimeEnvError(ShoalError):
    code = "RUNTIME_ENV_ERROR"
    http_status = 400


class BackendError(ShoalError):
    code = "BACKEND_ERROR"
    http_status = 503


class BackendUnavailableError(BackendError):
    code = "BACKEND_UNAVAILABLE"


class LaunchError(BackendError):
    code = "LAUNCH_ERROR"


class ResourceUnavailableError(BackendError):
    code = "RESOURCE_UNAVAILABLE"
    http_status = 400


class JobError(ShoalError):
    code = "JOB_ERROR"


class JobFailedError(JobError):
    code = "JOB_FAILED"


class JobCancelledError(JobError):
    code = "JOB_CANCELLED"


class JobTimeoutError(JobError):
    code = "JOB_TIMEOUT"


class ModelExportError(ShoalError):
    code = "MODEL_EXPORT_ERROR"
    http_status = 400


class ModelVerificationError(ModelExportError):
    code = "MODEL_VERIFICATION_FAILED"


class ServingError(ShoalError):
    code = "SERVING_ERROR"


class ModelLoadError(ServingError):
    code = "MODEL_LOAD_ERROR"


class OverloadedError(ServingError):
    code = "OVERLOADED"
    http_status = 503


class EndpointFailedError(ServingError):
    code = "ENDPOINT_FAILED"


class EndpointNotInServiceError(ServingError):
    """A team server asked to invoke an endpoint that is not InService (``details``:
    ``endpoint``, ``status``)."""

    code = "ENDPOINT_NOT_IN_SERVICE"
    http_status = 503


class EndpointUnreachableError(ServingError):
    """A team server that could not reach an endpoint's model server (``details``:
    ``endpoint``, ``delivered``: whether the request may have reached it)."""

    code = "ENDPOINT_UNREACHABLE"
    http_status = 502


class InvocationError(ServingError):
    """``details``: ``status_code`` and ``body`` of the server's answer."""

    code = "INVOCATION_ERROR"
    http_status = 502


class ApiError(ShoalError):
    code = "API_ERROR"
    http_status = 502


class ServerUnreachableError(StorageError, ApiError):
    """A team server that could not be reached (``details["transient"]``): waited out like a
    store outage (``storage/outage.py``) by the stores a session reaches through it."""

    code = "SERVER_UNREACHABLE"
    http_status = 503


class PayloadTooLargeError(ShoalError):
    """An upload larger than the team server takes (``SHOAL_SERVER_MAX_UPLOAD_BYTES``)."""

    code = "PAYLOAD_TOO_LARGE"
    http_status = 413


class AuthenticationError(ShoalError):
    """A team server's request without a valid token (missing, unknown, revoked, expired)."""

    code = "UNAUTHENTICATED"
    http_status = 401


class PermissionDeniedError(ShoalError):
    """A valid token whose scope does not allow the action (``details``: ``action``,
    ``scope``, ``needs``)."""

    code = "PERMISSION_DENIED"
    http_status = 403


def _all_subclasses(cls: type[ShoalError]) -> list[type[ShoalError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


def error_class_for_code(code: str) -> type[ShoalError]:
    """Return the error class whose ``code`` is *code* (``ShoalError`` if unknown)."""
    for cls in _all_subclasses(ShoalError):
        if cls.code == code:
            return cls
    return ShoalError
