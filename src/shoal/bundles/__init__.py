"""Portable deployment bundles: a model as a self-contained app for another platform.

``build_bundle`` writes a directory or ``.zip`` for Azure Functions, AWS Lambda, a container
image (the SageMaker serving contract) or any ASGI server: the model (as ONNX, int8 weights
when that keeps it small), one generated entry module, pinned ``requirements.txt`` and a README
with that platform's deploy and test commands. A bundle never imports shoal: it is not served
by ``shoal.serving`` or managed by ``shoal.endpoints``, but runs on the other platform alone.
``verify_bundle`` installs one into a fresh virtualenv, runs it as its platform would and
compares its answers with the source model.

Example::

    >>> from shoal.bundles import build_bundle, verify_bundle
    >>> record = build_bundle("model/", target="azure-functions", output="mnist.zip")  # doctest: +SKIP
    >>> verify_bundle(record.path).ok  # doctest: +SKIP
    True
"""

from shoal.bundles._build import BundleRecord, BundleWarning, build_bundle
from shoal.bundles._model import Parity
from shoal.bundles._options import (
    SIZE_LIMITS,
    SUPPORTED_MODEL_TYPES,
    AuthLevel,
    BundleOptions,
    BundleTarget,
    ModelType,
    OutputMap,
    SizeLimit,
)
from shoal.bundles._verify import VerifyCheck, VerifyReport, verify_bundle

__all__ = ["SIZE_LIMITS", "SUPPORTED_MODEL_TYPES", "AuthLevel", "BundleOptions", "BundleRecord",
           "BundleTarget", "BundleWarning", "ModelType", "OutputMap", "Parity", "SizeLimit",
           "VerifyCheck", "VerifyReport", "build_bundle", "verify_bundle"]
