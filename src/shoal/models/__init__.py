"""Models: ONNX export and verification (``shoal.models.onnx``).

Importing this package is cheap: torch, onnx, onnxruntime and skl2onnx load inside the
functions that need them.
"""

from __future__ import annotations

__all__: list[str] = []
