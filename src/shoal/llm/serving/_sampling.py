"""Choosing each live sequence's next token from one decode step's logits: the batch's argmax
when every row is plain greedy (the common case costs one argmax), else, row by row, OpenAI's
logit bias, then the penalties (repetition over prompt and output, presence and frequency over
the output, as vLLM applies them), then greedy or temperature / top-k / top-p sampling with the
row's own seeded generator. Log-probabilities are those of the model's distribution (vLLM's
default), with the top-k alternatives for the rows that ask."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shoal.llm.serving._params import GenerationParams

if TYPE_CHECKING:
    from shoal.llm.serving._engine import Generation

__all__ = ["Choice", "choose"]

#: (token ids, their log-probabilities, per row its top alternatives or None)
Choice = tuple[list[int], list[float], list[list[tuple[int, float]] | None] | None]


def choose(logits: Any, rows: Sequence[Generation]) -> Choice:
    """The next token of every row of *logits* (rows x vocabulary)."""
    import torch

    logits = logits.float()
    logprobs = torch.log_softmax(logits, -1)
    if all(g.params.plain_greedy for g in rows):
        chosen = logits.argmax(-1)
        tokens: list[int] = chosen.tolist()
    else:
        tokens = logits.argmax(-1).tolist()
        for row, g in enumerate(rows):
            params = g.params
            if params.plain_greedy:
                continue
            scores = _adjust(logits[row], g)
            if not params.do_sample:
                tokens[row] = int(scores.argmax())
            else:
                probs = torch.softmax(_warp(scores, params), -1)
                tokens[row] = int(torch.multinomial(probs, 1, generator=g.generator))
        chosen = torch.tensor(tokens, device=logits.device)
    picked: list[float] = logprobs.gather(1, chosen[:, None])[:, 0].tolist()
    k = max(g.params.top_logprobs for g in rows)
    if not k:
        return tokens, picked, None
    values, ids = logprobs.topk(k, -1)
    values_l, ids_l = values.tolist(), ids.tolist()
    tops: list[list[tuple[int, float]] | None] = []
    for row, g in enumerate(rows):
        n = g.params.top_logprobs
        tops.append(list(zip(ids_l[row][:n], values_l[row][:n], strict=True)) if n else None)
    return tokens, picked, tops


def _adjust(scores: Any, g: Generation) -> Any:
    """The row's logits after its logit bias and penalties."""
    import torch

    params = g.params
    device = scores.device
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], device=device)
        bias = torch.tensor([b for _, b in params.logit_bias], device=device)
        scores = scores.index_add(0, ids, bias)
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(g.prompt_ids + g.generated, device=device)
        picked = scores.gather(0, seen)
        penalty = params.repetition_penalty
        picked = torch.where(picked < 0, picked * penalty, picked / penalty)
        scores = scores.scatter(0, seen, picked)
    if (params.presence_penalty or params.frequency_penalty) and g.generated:
        counts = torch.bincount(torch.tensor(g.generated, device=device),
                                minlength=scores.shape[-1])[:scores.shape[-1]].float()
        scores = (scores - params.frequency_penalty * counts
                  - params.presence_penalty * (counts > 0).float())
    return scores


def _warp(scores: Any, params: GenerationParams) -> Any:
    """Temperature, then top-k, then top-p (nucleus), as transformers orders them."""
    import torch

    scores = scores / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        probs = torch.softmax(ordered, -1)
        before = probs.cumsum(-1) - probs  # mass of the tokens ranked above each one
        drop = before > params.top_p
        drop[0] = False
        scores = scores.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
    return scores
