"""What a bundle is built for and with: targets, their documented limits, the build knobs.

Values only; building is ``_build.py``, the model's side ``_onnx.py`` and ``_source.py``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from shoal.errors import InvalidArgumentError

__all__ = ["AuthLevel", "BundleOptions", "BundleTarget", "ModelType", "OutputMap", "SizeLimit",
           "SIZE_LIMITS", "SUPPORTED_MODEL_TYPES", "parse_target", "supported_types_text"]

_MB = 1_000_000  # the platforms' documents count decimal megabytes
DEFAULT_ROUTE = "classify"
_ROUTE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-/]{0,99}$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")
_E = TypeVar("_E", bound=StrEnum)


class BundleTarget(StrEnum):
    AZURE_FUNCTIONS = "azure-functions"
    AWS_LAMBDA = "aws-lambda"
    CONTAINER = "container"
    ASGI = "asgi"


class ModelType(StrEnum):
    ONNX = "onnx"
    SKLEARN = "scikit-learn"


class OutputMap(StrEnum):
    """How the answer is made from the model's outputs (``raw`` adds them all anyway)."""

    ARGMAX = "argmax"       # class index of the first 2-D output (scores, logits, log-probs)
    IDENTITY = "identity"   # the first output as it is (labels, regression values)


class AuthLevel(StrEnum):
    """Azure Functions' HTTP auth levels."""

    ANONYMOUS = "anonymous"
    FUNCTION = "function"
    ADMIN = "admin"


#: What each target serves. Everything becomes ONNX at build time, so every target takes the
#: same types; the table is per target because a target's runtime decides.
SUPPORTED_MODEL_TYPES: dict[BundleTarget, tuple[ModelType, ...]] = {
    t: (ModelType.ONNX, ModelType.SKLEARN) for t in BundleTarget}

_TYPE_FILES = {ModelType.ONNX: "model.onnx (or one *.onnx file)",
               ModelType.SKLEARN: "model.joblib or model.pkl, converted to ONNX with skl2onnx"}


def supported_types_text(target: BundleTarget) -> str:
    return "; ".join(f"{t.value} ({_TYPE_FILES[t]})" for t in SUPPORTED_MODEL_TYPES[target])


@dataclass(frozen=True, slots=True)
class SizeLimit:
    zipped_bytes: int | None
    unzipped_bytes: int | None
    what: str
    source: str


#: Documented deployment-size limits, checked by build (the bundle) and verify (with the
#: installed requirements). The container and ASGI targets have none of their own.
SIZE_LIMITS: dict[BundleTarget, SizeLimit] = {
    # AWS Lambda quotas: "Deployment package (.zip file archive) size: 50 MB (zipped, when
    # uploaded through the Lambda API or SDKs) ... 250 MB (unzipped)", layers included.
    # https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html
    BundleTarget.AWS_LAMBDA: SizeLimit(
        50 * _MB, 250 * _MB, "AWS Lambda takes a .zip of at most 50 MB uploaded directly "
        "(upload through S3 above that) and at most 250 MB unzipped, layers included",
        "https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html"),
    # Azure Functions service limits, Consumption plan: "Storage (persisted) 1 GB" per app
    # (and 1.5 GB of memory per instance, which the loaded model must fit in).
    # https://learn.microsoft.com/azure/azure-functions/functions-scale#service-limits
    BundleTarget.AZURE_FUNCTIONS: SizeLimit(
        None, 1000 * _MB, "the Azure Functions Consumption plan gives an app 1 GB of persisted "
        "storage (and 1.5 GB of memory per instance)",
        "https://learn.microsoft.com/azure/azure-functions/functions-scale#service-limits"),
}


@dataclass(frozen=True, slots=True)
class BundleOptions:
    """The knobs of ``build_bundle`` (and ``shoal bundle build``, ``Model.bundle``).

    Attributes:
        route: the HTTP route (Azure: ``/api/<route>``; ASGI and container: ``/<route>``
            besides ``/invocations``; Lambda answers on any path).
        auth_level: Azure Functions' auth level (Azure only; default ``function``).
        output_map: ``argmax`` (default for a model whose first output is 2-D) or
            ``identity``.
        output_key: the answer's key; default ``digits`` for ``argmax`` (the seed's schema),
            ``predictions`` otherwise.
        quantize: store Conv/Gemm/MatMul weights as int8 (per output channel; compute stays
            float32). ``None``: when those weights exceed 1 MiB.
        samples: a ``.npy``/``.npz`` file of real inputs for the parity check and ``verify``;
            random inputs otherwise.
    """

    route: str = DEFAULT_ROUTE
    auth_level: AuthLevel | None = None
    output_map: OutputMap | None = None
    output_key: str | None = None
    quantize: bool | None = None
    samples: Path | None = None

    @classmethod
    def of(cls, target: BundleTarget, **knobs: object) -> BundleOptions:
        """Validated options from keyword arguments (strings accepted for the enums)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(knobs) - names)
        if unknown:
            raise InvalidArgumentError(f"unknown bundle option(s) {unknown}; the options are "
                                       f"{sorted(names)}", options=unknown)
        values = {k: v for k, v in knobs.items() if v is not None}
        route = str(values.get("route", DEFAULT_ROUTE)).strip("/")
        if not _ROUTE.match(route) or ".." in route:
            raise InvalidArgumentError(f"route {route!r} is not a plain URL path (letters, "
                                       "digits, '-', '_', '/')", route=route)
        auth = values.get("auth_level")
        if auth is not None and target != BundleTarget.AZURE_FUNCTIONS:
            raise InvalidArgumentError(f"auth_level applies to azure-functions bundles only, "
                                       f"not {target}; protect the endpoint with the "
                                       "platform's own access control", target=str(target))
        key = values.get("output_key")
        if key is not None and not _KEY.match(str(key)):
            raise InvalidArgumentError(f"output_key {key!r} is not a plain name", key=key)
        samples = values.get("samples")
        return cls(route=route,
                   auth_level=_enum(AuthLevel, auth, "auth_level") if auth is not None
                   else (AuthLevel.FUNCTION if target == BundleTarget.AZURE_FUNCTIONS else None),
                   output_map=_enum(OutputMap, values.get("output_map"), "output_map"),
                   output_key=str(key) if key is not None else None,
                   quantize=bool(values["quantize"]) if "quantize" in values else None,
                   samples=Path(str(samples)) if samples is not None else None)


def parse_target(value: object) -> BundleTarget:
    target = _enum(BundleTarget, value, "target")
    if target is None:
        raise InvalidArgumentError(f"a target is required: one of "
                                   f"{[t.value for t in BundleTarget]}")
    return target


def _enum(cls: type[_E], value: object, what: str) -> _E | None:
    if value is None or isinstance(value, cls):
        return value
    try:
        return cls(str(value).lower())
    except ValueError:
        raise InvalidArgumentError(f"{what} {value!r} is not one of "
                                   f"{[m.value for m in cls]}", **{what: str(value)}) from None
