"""SageMaker path: sagemaker.huggingface — the HuggingFace estimator (shoal.training's, whose
create_model() makes a HuggingFaceModel) and shoal.llm's HuggingFaceModel."""

from __future__ import annotations

from shoal.huggingface._estimator import HuggingFace
from shoal.huggingface.llm_utils import get_huggingface_llm_image_uri
from shoal.llm._sagemaker_models import HuggingFaceModel, HuggingFacePredictor

__all__ = ["HuggingFace", "HuggingFaceModel", "HuggingFacePredictor",
           "get_huggingface_llm_image_uri"]
