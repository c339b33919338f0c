"""Experiment tracking at SageMaker's import path (``sagemaker.experiments``): ``Run``,
``load_run``, and ``current_run_context`` for code that submits jobs inside a run.

Runs, parameters, artifacts and metrics live in the session's metadata store; logged files in
its artifact store. ``shoal.analytics.ExperimentAnalytics`` turns an experiment into a table.
``Run`` and ``load_run`` load on first use, so the job-submitting hot path, which only asks
``current_run_context()``, imports nothing more.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shoal.experiments._context import current_run_context

if TYPE_CHECKING:
    from shoal.experiments.run import Run, load_run

__all__ = ["Run", "current_run_context", "load_run"]


def __getattr__(name: str) -> Any:
    if name in ("Run", "load_run"):
        value = getattr(importlib.import_module("shoal.experiments.run"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shoal.experiments' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
