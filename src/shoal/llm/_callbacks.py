"""Trainer hooks of the recipe: loss and learning rate per step to stdout (for the job's
metric definitions) and to the experiment run; tokens counted as batches are built.

Imports transformers at import time: loaded only once training starts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

if TYPE_CHECKING:
    from shoal.experiments.run import Run

__all__ = ["MetricsCallback", "TokenCounter"]

logger = logging.getLogger(__name__)

#: Trainer log keys reported, in this order, on one line per step.
_REPORTED = ("loss", "learning_rate", "grad_norm", "eval_loss")


class MetricsCallback(TrainerCallback):
    """``loss=... learning_rate=... step=N`` lines, and ``run.log_metric(..., step=N)``."""

    def __init__(self, run: Run | None, stream: TextIO) -> None:
        self.run = run
        self.stream = stream
        self.losses: list[tuple[int, float]] = []

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs:
            self.report(logs, state.global_step)

    def report(self, logs: dict[str, Any], step: int) -> None:
        values = {k: float(logs[k]) for k in _REPORTED
                  if isinstance(logs.get(k), (int, float)) and math.isfinite(float(logs[k]))}
        if not values:
            return
        if "loss" in values:
            self.losses.append((step, values["loss"]))
        text = " ".join(f"{k}={v:.6g}" for k, v in values.items())
        self.stream.write(f"{text} step={step}\n")
        self.stream.flush()
        if self.run is not None:
            for name, value in values.items():
                self.run.log_metric(name, value, step=step)

    def flush(self) -> None:
        if self.run is not None:
            self.run.flush()


class TokenCounter:
    """A collator wrapper that counts the real (unpadded) tokens it hands out."""

    def __init__(self, collate: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
        self.collate = collate
        self.tokens = 0

    def __call__(self, batch: list[dict[str, Any]]) -> dict[str, Any]:
        out = self.collate(batch)
        self.tokens += int(out["attention_mask"].sum())
        return out
