"""``sagemaker.model``'s path: ``from shoal.model import Model``."""

from __future__ import annotations

from shoal.endpoints import Model

__all__ = ["Model"]
