"""SageMaker path: sagemaker.huggingface — re-exports shoal.training.HuggingFace and shoal.llm's
HuggingFaceModel."""

from __future__ import annotations

from shoal.huggingface.llm_utils import get_huggingface_llm_image_uri
from shoal.llm._sagemaker_models import HuggingFaceModel, HuggingFacePredictor
from shoal.training import HuggingFace

__all__ = ["HuggingFace", "HuggingFaceModel", "HuggingFacePredictor",
           "get_huggingface_llm_image_uri"]
