"""``HuggingFace``: SageMaker's Hugging Face estimator, a framework estimator whose job
environment pins ``transformers`` (and ``torch`` when ``pytorch_version`` is given)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.errors import InvalidArgumentError
from shoal.training._framework_env import installed_matches, pin_for
from shoal.training._frameworks import Framework

__all__ = ["HuggingFace"]


class HuggingFace(Framework):
    """``sagemaker.huggingface.HuggingFace`` (SageMaker's arguments, in its order): runs a
    transformers training script in script mode. ``transformers_version`` defaults to the
    installed one; ``tensorflow_version`` is not provided (the PyTorch flavour only);
    ``compiler_config`` (SageMaker Training Compiler) is kept with no effect."""

    _dist = "transformers"
    _framework_name = "huggingface"

    def __init__(self, py_version: str | None = None, entry_point: str | None = None,
                 transformers_version: str | None = None,
                 tensorflow_version: str | None = None, pytorch_version: str | None = None,
                 source_dir: str | None = None,
                 hyperparameters: Mapping[str, Any] | None = None,
                 image_uri: str | None = None, distribution: Mapping[str, Any] | None = None,
                 compiler_config: Any = None, **kwargs: Any) -> None:
        if tensorflow_version is not None:
            raise InvalidArgumentError(
                f"tensorflow_version={tensorflow_version!r}: shoal runs the PyTorch flavour of "
                "Hugging Face training; give pytorch_version (or neither)",
                argument="tensorflow_version")
        self.transformers_version = transformers_version
        self.tensorflow_version = None
        self.pytorch_version = pytorch_version
        self.compiler_config = compiler_config
        self._torch = ("torch", pin_for(pytorch_version)) if pytorch_version else None
        super().__init__(entry_point=entry_point, framework_version=transformers_version,
                         py_version=py_version, source_dir=source_dir,
                         hyperparameters=hyperparameters, image_uri=image_uri,
                         distribution=distribution, **kwargs)
        if compiler_config is not None:
            self.inert["compiler_config"] = repr(compiler_config)

    def _env_requirements(self) -> str | None:
        base = super()._env_requirements()
        if self._torch is None:
            return base
        dist, pin = self._torch
        if base is None and installed_matches(dist, pin):
            return None
        if base is None and self._framework is not None:  # (distribution, release)
            base = f"{self._framework[0]}{pin_for(self._framework[1])}\n"
        return f"{base or ''}{dist}{pin}\n"

    def _framework_module(self) -> str:
        return "sagemaker_pytorch_container.training:main"
