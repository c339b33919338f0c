"""``create_model()`` of the framework estimators, as in SageMaker: the latest training job's
model as the framework's model class (``PyTorchModel``, ``SKLearnModel``; ``HuggingFaceModel``
in ``shoal.huggingface``), ready to ``deploy()`` or to keep.

As SageMaker's do, the framework estimators hand the model their training ``entry_point`` and
``source_dir`` as its inference code: a script that defines ``model_fn``/``predict_fn``... is
served with them (under ``if __name__ == "__main__":``, its training part does not run at
import), and the functions it leaves out fall back to shoal's (the artifact is loaded as if
there were no script). The training job's name is the model's name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VPC_CONFIG_DEFAULT", "FrameworkModelMaker", "vpc_config"]

#: SageMaker's "the estimator's own VPC settings" marker (``sagemaker.vpc_utils``).
VPC_CONFIG_DEFAULT = "VPC_CONFIG_DEFAULT"


def vpc_config(override: Any) -> Any:
    """The ``vpc_config`` a model gets (kept with no effect: there is no VPC here)."""
    return None if override == VPC_CONFIG_DEFAULT else override


class FrameworkModelMaker:
    """``create_model()`` for a framework estimator; ``_model_class`` names the model class."""

    def _model_class(self) -> type[Any]:
        raise NotImplementedError

    def create_model(self, model_server_workers: int | None = None, role: str | None = None,
                     vpc_config_override: Any = VPC_CONFIG_DEFAULT,
                     entry_point: str | None = None, source_dir: str | None = None,
                     dependencies: Any = None, **kwargs: Any) -> Any:
        """The trained model as SageMaker's framework model (SageMaker's arguments, in its
        order); *kwargs* go to the model's constructor (``env``, ``predictor_cls``,
        ``name``...)."""
        est: Any = self
        kwargs.setdefault("name", est._require_job().name)
        if "image_uri" not in kwargs and est.inert.get("image_uri"):
            kwargs["image_uri"] = est.inert["image_uri"]
        code_dir = source_dir or (str(est.source_dir) if est.source_dir else None)
        model = self._model_class()(
            est.model_data, role or est.inert.get("role"), entry_point or est.entry_point,
            framework_version=est.framework_version, py_version=est.py_version,
            source_dir=code_dir, model_server_workers=model_server_workers,
            sagemaker_session=est.sagemaker_session,
            vpc_config=vpc_config(vpc_config_override),
            dependencies=dependencies or est.dependencies, **kwargs)
        model.framework_requirements = est._serving_framework()
        return model
