"""``sagemaker.pytorch``'s path: ``from shoal.pytorch import PyTorch``."""

from __future__ import annotations

from shoal.training import PyTorch

__all__ = ["PyTorch"]
