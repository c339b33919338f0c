"""Embedding models (BERT-like encoders) behind ``/v1/embeddings``: the model's last hidden
state pooled as its sentence-transformers configuration says (``1_Pooling/config.json``: CLS,
mean or last token; CLS when there is none, vLLM's default for BERT-like models), then
L2-normalized (vLLM's default for embedding models).

``EmbeddingEngine`` has the generation engines' lifecycle (``start``/``stop``, ``live``,
``queue_depth``) so the app treats it alike; ``embed`` runs one padded batch on the caller's
thread (the app runs it off the event loop), one batch at a time.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from shoal.errors import ModelLoadError

__all__ = ["EmbeddingEngine", "Pooling", "is_embedding_model", "pooling_of"]

log = logging.getLogger(__name__)

#: architecture names of causal (generating) models
_GENERATIVE = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


class Pooling(StrEnum):
    CLS = "cls"
    MEAN = "mean"
    LAST = "last"


def is_embedding_model(path: Path, config: Any) -> bool:
    """A sentence-transformers model (``modules.json``), or one whose architectures are all
    bare encoders (``BertModel``), not generating heads."""
    if (path / "modules.json").is_file():
        return True
    names = list(getattr(config, "architectures", None) or ())
    return bool(names) and all(n.endswith("Model") and not n.endswith(_GENERATIVE)
                               for n in names)


def pooling_of(path: Path) -> Pooling:
    """The pooling sentence-transformers' configuration names (the Pooling module of
    ``modules.json``, else ``1_Pooling/config.json``); CLS when there is none."""
    folder = "1_Pooling"
    modules = path / "modules.json"
    if modules.is_file():
        try:
            entries = json.loads(modules.read_text())
        except ValueError as e:
            raise ModelLoadError(f"{modules} is not valid JSON: {e}", path=str(modules)) from e
        folder = next((str(m.get("path", folder)) for m in entries if isinstance(m, dict)
                       and str(m.get("type", "")).endswith("Pooling")), folder)
    config_file = path / folder / "config.json"
    if not config_file.is_file():
        return Pooling.CLS
    try:
        config = json.loads(config_file.read_text())
    except ValueError as e:
        raise ModelLoadError(f"{config_file} is not valid JSON: {e}",
                             path=str(config_file)) from e
    if config.get("pooling_mode_mean_tokens"):
        return Pooling.MEAN
    if config.get("pooling_mode_lasttoken"):
        return Pooling.LAST
    if config.get("pooling_mode_cls_token"):
        return Pooling.CLS
    raise ModelLoadError(f"{config_file} asks for a pooling this server does not do (it does "
                         f"pooling_mode_cls_token, pooling_mode_mean_tokens and "
                         f"pooling_mode_lasttoken)", path=str(config_file))


class EmbeddingEngine:
    """*model* (a transformers encoder) embedding token ids, pooled with *pooling*."""

    def __init__(self, model: Any, tokenizer: Any, *, pooling: Pooling, max_batch: int,
                 normalize: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.max_batch = max_batch
        self.normalize = normalize
        self.on_step: Callable[[], None] | None = None
        self.vocab_size = int(getattr(model.config, "vocab_size", 0) or len(tokenizer))
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self._lock = threading.Lock()
        self._running = 0
        self._waiting = 0

    @property
    def live(self) -> int:
        return self._running

    @property
    def queue_depth(self) -> int:
        return self._waiting

    def start(self) -> None:
        """Nothing runs in the background."""

    def stop(self) -> None:
        """Nothing runs in the background."""

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One vector per token-id list, in chunks of ``max_batch``."""
        self._waiting += 1
        with self._lock:
            self._waiting -= 1
            self._running = len(inputs)
            try:
                out: list[list[float]] = []
                for start in range(0, len(inputs), self.max_batch):
                    out.extend(self._batch(inputs[start:start + self.max_batch]))
                return out
            finally:
                self._running = 0

    def _batch(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        import torch
        import torch.nn.functional as F

        length = max(len(ids) for ids in inputs)
        ids = torch.full((len(inputs), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(inputs), length), dtype=torch.long)
        for row, row_ids in enumerate(inputs):
            ids[row, :len(row_ids)] = torch.tensor(list(row_ids))
            mask[row, :len(row_ids)] = 1
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            hidden = self.model(input_ids=ids.to(device),
                                attention_mask=mask.to(device)).last_hidden_state.float()
        mask = mask.to(device)
        if self.pooling is Pooling.CLS:
            pooled = hidden[:, 0]
        elif self.pooling is Pooling.MEAN:
            weights = mask[..., None].float()
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        else:
            pooled = hidden[torch.arange(len(inputs), device=device), mask.sum(-1) - 1]
        if self.normalize:
            pooled = F.normalize(pooled, p=2, dim=-1)
        result: list[list[float]] = pooled.tolist()
        return result


def load_embedding(path: Path, tokenizer: Any, *, dtype: str, max_batch: int,
                   trust_remote_code: bool, placement: dict[str, Any]) -> EmbeddingEngine:
    """The encoder at *path* as an ``EmbeddingEngine``."""
    from transformers import AutoModel

    try:
        model = AutoModel.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code,
                                          **placement).eval()
    except (OSError, ValueError, ImportError) as e:
        raise ModelLoadError(f"cannot load the embedding model from {path}: "
                             f"{type(e).__name__}: {e}", path=str(path)) from e
    pooling = pooling_of(path)
    log.info("embedding model %s: %s pooling, normalized", type(model).__name__, pooling.value)
    return EmbeddingEngine(model, tokenizer, pooling=pooling, max_batch=max_batch)
