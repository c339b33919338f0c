"""At SageMaker's path ``sagemaker.image_uris``: ``retrieve()`` names a framework environment.

SageMaker returns an ECR image URI; shoal runs no containers, so it returns a descriptive URI
in shoal's own registry, ``shoal.local/<framework>[-<scope>]:<version>[-<cpu|gpu>][-<py>]``,
which every ``image_uri=`` accepts. An ``Estimator(image_uri=...)`` given one for a framework
shoal knows (``sklearn``, ``pytorch``, ``xgboost``, ``huggingface``, ``tensorflow``) runs
its job with that framework pinned, as a framework estimator would; any other image URI is
kept on the record with no effect.

Example:
    >>> retrieve("sklearn", "us-east-1", version="1.2-1", image_scope="training")
    'shoal.local/sklearn-training:1.2-1-cpu-py3'
    >>> parse_image_uri('shoal.local/sklearn-training:1.2-1-cpu-py3').requirement
    ('scikit-learn', '==1.2.*')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shoal.errors import InvalidArgumentError

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["REGISTRY", "ShoalImage", "parse_image_uri", "retrieve"]

#: The registry host of the URIs ``retrieve`` returns.
REGISTRY = "shoal.local"

#: SageMaker framework name -> the PyPI distribution its container is built around.
_DISTRIBUTIONS = {"sklearn": "scikit-learn", "pytorch": "torch", "xgboost": "xgboost",
                  "tensorflow": "tensorflow", "huggingface": "transformers"}
#: Frameworks whose models shoal serves with its LLM server (DJL's and TGI's containers).
LLM_FRAMEWORKS = frozenset({"huggingface-llm", "huggingface-tei", "djl-lmi", "djl-deepspeed",
                            "djl-inference", "djl-tensorrtllm", "djl-neuronx"})
_SCOPES = ("training", "inference", "inference_graviton")
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_URI = re.compile(rf"^{re.escape(REGISTRY)}/(?P<repo>[a-z0-9-]+):(?P<tag>[A-Za-z0-9._-]+)$")
_PY = re.compile(r"^py\d+$")


@dataclass(frozen=True, slots=True)
class ShoalImage:
    """What a ``shoal.local/...`` URI names."""

    framework: str
    version: str
    scope: str | None = None
    processor: str | None = None
    py_version: str | None = None

    @property
    def requirement(self) -> tuple[str, str] | None:
        """(distribution, version pin) the job's environment gets, or None (no package:
        an LLM server, or ``latest``)."""
        dist = _DISTRIBUTIONS.get(self.framework)
        if dist is None or self.version in ("", "latest"):
            return None
        release = self.version.split("-")[0] if self.framework in ("sklearn", "xgboost") \
            else self.version
        parts = release.split(".")
        return dist, f"=={release}" if len(parts) >= 3 else f"=={release}.*"

    @property
    def serves_llm(self) -> bool:
        return self.framework in LLM_FRAMEWORKS


def retrieve(framework: str, region: str | None = None, version: str | None = None,
             py_version: str | None = None, instance_type: str | None = None,
             accelerator_type: str | None = None, image_scope: str | None = None,
             container_version: str | None = None, distribution: Any = None,
             base_framework_version: str | None = None, training_compiler_config: Any = None,
             model_id: str | None = None, model_version: str | None = None,
             hub_arn: str | None = None, tolerate_vulnerable_model: bool = False,
             tolerate_deprecated_model: bool = False, sdk_version: str | None = None,
             inference_tool: str | None = None, serverless_inference_config: Any = None,
             sagemaker_session: Session | None = None, config_name: str | None = None,
             model_type: Any = None) -> str:
    """A ``shoal.local/...`` URI for *framework* at *version* (SageMaker's arguments).

    *region*, *accelerator_type*, *container_version*, *distribution*, the JumpStart and
    compiler arguments change nothing here: there is one registry and no container.
    *version* defaults to ``latest``; *instance_type* picks ``cpu`` or ``gpu`` as SageMaker's
    tags do.
    """
    if not isinstance(framework, str) or not _NAME.match(framework):
        raise InvalidArgumentError(f"image_uris.retrieve: framework {framework!r} must be a "
                                   "framework name such as 'sklearn', 'pytorch', 'xgboost' or "
                                   "'huggingface'", argument="framework")
    if image_scope is not None and image_scope not in _SCOPES:
        raise InvalidArgumentError(f"image_uris.retrieve: image_scope {image_scope!r} must be "
                                   f"one of {', '.join(_SCOPES)}", argument="image_scope")
    if model_id is not None:
        raise InvalidArgumentError(
            f"image_uris.retrieve(model_id={model_id!r}): JumpStart models are not available "
            "here (they come from AWS's model hub); deploy the model's files or a Hugging Face "
            "model with shoal.huggingface.HuggingFaceModel", argument="model_id")
    tag = [str(version) if version else "latest"]
    if base_framework_version:
        tag.append(str(base_framework_version))
    if instance_type is not None:
        tag.append(_processor(instance_type))
    if py_version:
        tag.append(str(py_version))
    repo = framework if image_scope is None else f"{framework}-{image_scope.replace('_', '-')}"
    return f"{REGISTRY}/{repo}:{'-'.join(tag)}"


def _processor(instance_type: str) -> str:
    from shoal.core.resources import resolve_instance_type

    return "gpu" if resolve_instance_type(instance_type).gpus else "cpu"


def parse_image_uri(uri: Any) -> ShoalImage | None:
    """The framework and version a ``shoal.local/...`` URI names; None for any other URI."""
    if not isinstance(uri, str):
        return None
    match = _URI.match(uri.strip())
    if match is None:
        return None
    repo, tag = match["repo"], match["tag"]
    scope = None
    for s in ("inference-graviton", "training", "inference"):
        if repo.endswith(f"-{s}"):
            repo, scope = repo[: -len(s) - 1], s
            break
    parts = tag.split("-")
    py = parts.pop() if parts and _PY.match(parts[-1]) else None
    processor = parts.pop() if parts and parts[-1] in ("cpu", "gpu") else None
    version = "-".join(parts) or "latest"
    if "-" in version and repo not in ("sklearn", "xgboost"):  # their "1.2-1" is one version
        version = version.split("-")[0]  # the rest: a base framework version
    return ShoalImage(repo, version, scope, processor, py)
