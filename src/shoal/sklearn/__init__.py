"""``sagemaker.sklearn``'s path: ``from shoal.sklearn import SKLearn``."""

from __future__ import annotations

from shoal.training import SKLearn

__all__ = ["SKLearn"]
