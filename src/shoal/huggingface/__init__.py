"""SageMaker path alias: sagemaker.huggingface — re-exports HuggingFace (shoal.training's
estimator, whose create_model() makes a HuggingFaceModel: shoal.huggingface._estimator),
get_huggingface_llm_image_uri (shoal.huggingface.llm_utils) and shoal.llm's HuggingFaceModel and
HuggingFacePredictor."""

from __future__ import annotations

from shoal.huggingface._estimator import HuggingFace
from shoal.huggingface.llm_utils import get_huggingface_llm_image_uri
from shoal.llm._sagemaker_models import HuggingFaceModel, HuggingFacePredictor

__all__ = ["HuggingFace", "HuggingFaceModel", "HuggingFacePredictor",
           "get_huggingface_llm_image_uri"]
