"""``sagemaker.huggingface.HuggingFace``: the training estimator (``shoal.training``'s) whose
``create_model()`` and ``deploy()`` make a ``HuggingFaceModel``, as in SageMaker.

It lives in ``shoal.llm``, a layer above ``shoal.training`` (the model needs the LLM server's
model lookup); ``shoal.training.HuggingFace`` trains the same way and deploys as a plain
``Model``. ``shoal.huggingface`` (SageMaker's path) only re-exports it.
"""

from __future__ import annotations

from typing import Any

from shoal.llm._sagemaker_models import HuggingFaceModel
from shoal.training import HuggingFace as _TrainingHuggingFace
from shoal.training.models import VPC_CONFIG_DEFAULT, vpc_config

__all__ = ["HuggingFace"]

class HuggingFace(_TrainingHuggingFace):
    """``sagemaker.huggingface.HuggingFace`` (SageMaker's arguments, in its order): trains a
    transformers script in script mode; ``create_model()``/``deploy()`` serve the trained model
    as a ``HuggingFaceModel`` (shoal's LLM server for a model directory, the model server when
    inference code is given). ``deploy()`` is ``Estimator.deploy`` (SageMaker's signature),
    which builds the model with this ``create_model()``."""

    # SageMaker's HuggingFace.create_model() takes other positional arguments than Estimator's.
    def create_model(self, model_server_workers: int | None = None,  # type: ignore[override]
                     role: str | None = None,
                     vpc_config_override: Any = VPC_CONFIG_DEFAULT,
                     entry_point: str | None = None, source_dir: str | None = None,
                     dependencies: Any = None, **kwargs: Any) -> HuggingFaceModel:
        """The latest training job's ``model.tar.gz`` as a ``HuggingFaceModel`` (SageMaker's
        arguments, in its order). As in SageMaker, the training ``entry_point`` is not
        inference code: give *entry_point* (and *source_dir*) for handlers; without them the
        model directory is served by the LLM server. *kwargs* go to ``HuggingFaceModel``."""
        kwargs.setdefault("name", self._require_job().name)
        if "image_uri" not in kwargs and self.inert.get("image_uri"):
            kwargs["image_uri"] = self.inert["image_uri"]
        if entry_point is not None:
            source_dir = source_dir or (str(self.source_dir) if self.source_dir else None)
            if source_dir is not None:
                kwargs["source_dir"] = source_dir
            kwargs["dependencies"] = dependencies or self.dependencies
        elif dependencies is not None:
            kwargs["dependencies"] = dependencies
        return HuggingFaceModel(
            role or self.inert.get("role"), model_data=self.model_data,
            entry_point=entry_point, transformers_version=self.framework_version,
            pytorch_version=self.pytorch_version, py_version=self.py_version,
            model_server_workers=model_server_workers,
            sagemaker_session=self.sagemaker_session,
            vpc_config=vpc_config(vpc_config_override), **kwargs)
