"""Path alias: shoal.models — the older package of ``shoal.models.onnx``; model export is
``shoal.export`` (``shoal.export.onnx``).

The ``Model`` class is ``shoal.Model`` (``shoal.endpoints``); this package holds no code.
"""

from __future__ import annotations

__all__: list[str] = []
