"""SageMaker path alias: sagemaker.huggingface — re-exports shoal.llm's HuggingFace (the
training estimator whose create_model() makes a HuggingFaceModel), HuggingFaceModel and
HuggingFacePredictor, and get_huggingface_llm_image_uri (shoal.huggingface.llm_utils)."""

from __future__ import annotations

from shoal.huggingface.llm_utils import get_huggingface_llm_image_uri
from shoal.llm import HuggingFace, HuggingFaceModel, HuggingFacePredictor

__all__ = ["HuggingFace", "HuggingFaceModel", "HuggingFacePredictor",
           "get_huggingface_llm_image_uri"]
