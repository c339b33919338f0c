"""The built-in engine: a transformers causal LM decoded with continuous (iteration-level)
batching on one thread.

The live batch is one left-padded KV cache with its attention mask. Each iteration admits
waiting requests (prefilled together in one forward call, up to ``_PREFILL_TOKENS`` padded
tokens, their first tokens handed on at once; then their caches are left-padded to the
batch's length and concatenated), prefills those that arrived meanwhile too (prefill goes
before decode, so a burst's late arrivals do not wait for a decode step), runs one decode
step for every live sequence, and drops the sequences that finished or whose client went
away (rows removed, then leading columns no row uses trimmed), so memory follows the live
batch. Position ids are each row's own count of real tokens, and
padding is masked out, so a sequence decodes as it would alone: greedy output equals its solo
``generate()``.

A decode step costs little besides the model's forward: the mask grows into a pre-allocated
buffer (a column of ones per step, no copy) and, for SDPA models without sliding windows, goes
to the model as the 4-D boolean mask transformers would build from it (``None`` when no row is
padded); positions are a counter; the next tokens of every row come from one argmax and one
``tolist()``; text is detokenized incrementally (only the last few tokens of each row are
decoded, by the Rust tokenizer directly when that is what ``decode`` does); and the steps'
events are handed on in batches (``on_step``): at once after a step with a request's first
token, its last or an error, otherwise at most every ``_STREAM_INTERVAL_S``, so a server wakes
its event loop at most once per step, and on fast steps less often.

The request side (HTTP, SSE) lives in ``_app``; this module knows tokens and text only.
"""

from __future__ import annotations

import abc
import itertools
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shoal.errors import OverloadedError
from shoal.llm.serving._params import GenerationParams
from shoal.llm.serving._sampling import choose
from shoal.serving.loop import ServingLoop

__all__ = ["EngineLoop", "EngineObserver", "FinishReason", "Generation", "TokenEvent",
           "TransformersEngine"]

log = logging.getLogger(__name__)


class FinishReason(StrEnum):
    LENGTH = "length"
    EOS = "eos_token"
    STOP = "stop_sequence"


@dataclass(slots=True)
class TokenEvent:
    """One generated token. ``text`` is the new text it adds (possibly empty: a partial UTF-8
    character or a possible start of a stop sequence is held back); all ``text`` of a
    generation concatenate to its final ``generated_text``, set on the last event with
    ``finish``. ``error`` ends a generation that failed. ``top``: the likeliest tokens and
    their log-probabilities, when the request asked for them (``top_logprobs``)."""

    token_id: int
    text: str
    logprob: float
    special: bool
    finish: FinishReason | None = None
    generated_text: str | None = None
    error: str | None = None
    top: list[tuple[int, float]] | None = None


class EngineObserver:
    """Receives the engine's measurements (the server's metrics); does nothing by default.
    Called on the engine's thread."""

    def step(self, live: int, tokens: int, seconds: float) -> None:
        """One decode step over *live* sequences produced *tokens* tokens."""

    def prefilled(self, prompt_tokens: int) -> None:
        """Prompts of *prompt_tokens* tokens in all were prefilled."""

    def first_token(self, seconds: float) -> None:
        """A request got its first token *seconds* after it was submitted."""

    def inter_token(self, seconds: list[float]) -> None:
        """Sequences got a token after their first, each *seconds* after their previous."""

    def finished(self, seconds: float, reason: str) -> None:
        """A request ended *seconds* after it was submitted; *reason*: ``stop``, ``length``
        or ``abort`` (cancelled or failed)."""


_ids = itertools.count(1)


def overloaded(waiting: int, limit: int) -> OverloadedError:
    """The refusal of a request when *waiting* requests already wait (``job_queue_size``)."""
    return OverloadedError(f"{waiting} requests already wait for a batch slot "
                           f"(job_queue_size={limit}); retry shortly", queue=waiting)

#: Mask columns allocated ahead of the live batch (a decode step fills one).
_MASK_HEADROOM = 64
#: Padded prompt tokens one prefill call takes at most (a longer prompt goes alone).
_PREFILL_TOKENS = 2048
#: Seconds a step's ordinary tokens may wait to be handed on with the next steps' (``on_step``
#: is called at most this often, except at once for a request's first token, its last, an
#: error, and before the engine waits): on a small model a decode step takes ~1 ms, and each
#: hand-over costs the server's event loop a wake-up and a write per stream under the GIL it
#: shares with the engine. A slower step hands on every step, as before.
_STREAM_INTERVAL_S = 0.004


class Generation:
    """One request inside the engine; ``cancel()`` frees its slot at the next step."""

    __slots__ = ("cancelled", "emitted", "finish", "first_token_at", "generated", "generator", "id",
                 "last_token_at", "on_event", "params", "prefix_offset", "prompt_ids",
                 "read_offset", "seed", "sent", "submitted_at", "text")

    def __init__(self, prompt_ids: Sequence[int], params: GenerationParams,
                 on_event: Callable[[TokenEvent], None]) -> None:
        self.id = next(_ids)
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.on_event = on_event
        self.cancelled = False
        self.emitted = False  # an event of it was handed to on_event
        self.generated: list[int] = []
        self.text = ""  # the generated tokens' text, detokenized incrementally
        # generated[prefix_offset:read_offset] is the context the next tokens are decoded with
        self.prefix_offset = 0
        self.read_offset = 0
        self.sent = 0  # characters of text already emitted
        self.finish: FinishReason | None = None
        self.seed: int | None = params.seed
        self.generator: Any = None
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.last_token_at = 0.0

    def cancel(self) -> None:
        self.cancelled = True


class EngineLoop(ServingLoop[Generation]):
    """What the LLM engines share: ``submit`` (thread-safe, returns at once; raises
    ``OverloadedError`` when ``max_queue`` requests already wait), the loop's iteration
    around ``_take`` (under the lock) and ``_work`` (outside it), and ``on_step`` (when
    given) called on the loop's thread after each iteration's events, so a consumer can hand
    a step's events on at once. ``on_step`` is called at most every ``stream_interval_s``
    (the events of the steps between wait for it), except at once after a step that emitted a
    request's first event, its last or an error, and before the loop waits for work."""

    #: at most this often, ``on_step`` (see ``_STREAM_INTERVAL_S``)
    stream_interval_s = _STREAM_INTERVAL_S

    def __init__(self, *, max_queue: int, observer: EngineObserver | None,
                 on_step: Callable[[], None] | None) -> None:
        super().__init__()
        self.max_queue = max_queue
        self.observer = observer or EngineObserver()
        self.on_step = on_step
        self._urgent = False  # an event since the last on_step must go out now
        self._held = False  # events emitted since the last on_step
        self._handed_at = 0.0  # perf_counter of the last on_step

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def submit(self, prompt_ids: Sequence[int], params: GenerationParams,
               on_event: Callable[[TokenEvent], None]) -> Generation:
        generation = Generation(prompt_ids, params, on_event)
        self._accepted(generation)
        with self._cond:
            waiting = self.queue_depth
            if waiting >= self.max_queue:
                raise overloaded(waiting, self.max_queue)
            self._enqueue(generation)
        return generation

    def _accepted(self, generation: Generation) -> None:
        """A new generation, before it is queued (on the caller's thread)."""

    def _iteration(self) -> bool:
        """Take waiting requests, run a step (``_work``), hand the events on; False once
        stopped."""
        with self._cond:
            if not self._wait_for_work():
                self._fail_all("the server is shutting down")
                self._step_done()
                return False
            new = self._take()
        self._work(new)
        self._step_done()
        return True

    def _emit(self, g: Generation, event: TokenEvent) -> None:
        if not g.emitted or event.finish is not None or event.error is not None:
            self._urgent = True  # a first token, a last one or an error goes out at once
        g.emitted = self._held = True
        try:
            g.on_event(event)
        except Exception:  # a callback's failure must not stop the batch
            log.exception("delivering a token of generation %s failed; cancelling it", g.id)
            g.cancel()

    def _wait_for_work(self) -> bool:
        if self._held and (self._stopping or self._paused
                           or not (self._pending or self._has_work())):
            self._step_done(now=True)  # about to wait: nothing stays held meanwhile
        return super()._wait_for_work()

    def _step_done(self, *, now: bool = False) -> None:
        """After a step: call ``on_step`` when the step's events must go out now, or
        ``stream_interval_s`` has passed since the last call (else they wait for a later
        step's call)."""
        if self.on_step is None or not self._held:
            return
        at = time.perf_counter()
        if not (now or self._urgent or at - self._handed_at >= self.stream_interval_s):
            return
        self._urgent = self._held = False
        self._handed_at = at
        try:
            self.on_step()
        except Exception:  # the consumer's failure must not stop the engine
            log.exception("handing a step's events on failed")

    @abc.abstractmethod
    def _take(self) -> list[Generation]:
        """The waiting requests this iteration admits (the lock held)."""

    @abc.abstractmethod
    def _work(self, new: list[Generation]) -> None:
        """Admit *new* and run one step of the batch (outside the lock)."""

    @abc.abstractmethod
    def _fail_all(self, why: str) -> None:
        """End every generation with the error *why* (the lock held)."""


class TransformersEngine(EngineLoop):
    """Continuous batching over a loaded ``model`` and ``tokenizer``.

    ``submit`` is thread-safe and returns at once; events arrive through the generation's
    ``on_event`` on the engine's thread (keep the callback short), and ``on_step`` (when
    given) is called on that thread after each iteration's events, so a consumer can hand a
    step's events on at once. Raises ``OverloadedError`` when ``max_queue`` requests already
    wait.
    """

    thread_name = "shoal-llm-engine"

    def __init__(self, model: Any, tokenizer: Any, *, max_batch: int, max_queue: int,
                 max_model_len: int, observer: EngineObserver | None = None,
                 on_step: Callable[[], None] | None = None) -> None:
        super().__init__(max_queue=max_queue, observer=observer, on_step=on_step)
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.max_model_len = max_model_len
        self.eos_ids = _eos_ids(model, tokenizer)
        self.special_ids = set(getattr(tokenizer, "all_special_ids", ())) | self.eos_ids
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else next(iter(self.eos_ids), 0))
        self.device = next(model.parameters()).device
        output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") \
            else None
        self.vocab_size = int(getattr(output, "out_features", None)
                              or getattr(model.config, "vocab_size", 0) or len(tokenizer))
        self.decode_text = _text_decoder(tokenizer)
        self.mask_4d = _takes_4d_mask(model)
        self._active: list[Generation] = []
        self._cache: Any = None
        # the live batch's attention mask: the first ``_width`` columns of ``_buffer`` (bool;
        # the columns after them are already ones); ``_lengths``: each row's real tokens
        self._buffer: Any = None
        self._width = 0
        self._lengths: Any = None
        self._padded = False

    # --- the request side --------------------------------------------------------------------

    @property
    def live(self) -> int:
        return len(self._active)

    @property
    def _mask(self) -> Any:
        """The live batch's attention mask (rows x columns, bool)."""
        return None if self._buffer is None else self._buffer[:, :self._width]

    # --- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        import torch

        with torch.inference_mode():
            super()._run()

    def _has_work(self) -> bool:
        return bool(self._active)

    def _work(self, new: list[Generation]) -> None:
        """Retire the cancelled rows, prefill *new* (and what arrives meanwhile), decode."""
        admitted: list[Generation] = []
        try:
            if any(g.cancelled for g in self._active):
                for g in self._active:
                    if g.cancelled:
                        self.observer.finished(time.perf_counter() - g.submitted_at, "abort")
                self._retire([g.cancelled for g in self._active])
            # Prefill before decode: requests that arrived while a prefill ran are prefilled
            # too before the next decode step (each round takes batch slots, so it ends).
            while new:
                admitted.extend(new)
                for group in _prefill_groups(new):
                    self._prefill(group)
                    self._step_done()  # first tokens go out now, not after the decode step
                with self._cond:
                    new = [] if self._stopping or self._paused else self._take()
            if self._active:
                self._decode()
        except Exception as e:  # a bug or an OOM: fail the batch, keep serving
            log.exception("generation step failed; failing the %d live requests",
                          len(self._active) + len(admitted))
            for g in {*self._active, *(g for g in admitted if g.finish is None)}:
                self.observer.finished(time.perf_counter() - g.submitted_at, "abort")
                self._emit(g, TokenEvent(-1, "", 0.0, False, error=f"{type(e).__name__}: {e}"))
            self._active, self._cache, self._buffer, self._lengths = [], None, None, None

    def _take(self) -> list[Generation]:
        """The waiting requests that fit the batch, oldest first (the lock held)."""
        room = self.max_batch - len(self._active)
        new: list[Generation] = []
        while self._pending and len(new) < room:
            g = self._pending.popleft()
            if not g.cancelled:
                new.append(g)
        return new

    def _prefill(self, new: list[Generation]) -> None:
        import torch
        from transformers import DynamicCache

        length = max(len(g.prompt_ids) for g in new)
        ids = torch.full((len(new), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(new), length), dtype=torch.long)
        for row, g in enumerate(new):
            n = len(g.prompt_ids)
            ids[row, length - n:] = torch.tensor(g.prompt_ids)
            mask[row, length - n:] = 1
            if g.params.do_sample:
                if g.seed is None:
                    g.seed = random.randrange(2**63)
                g.generator = torch.Generator(device=self.device).manual_seed(g.seed)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.observer.prefilled(sum(len(g.prompt_ids) for g in new))
        started = time.perf_counter()
        cache = DynamicCache()
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                         position_ids=positions.to(self.device), past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        self._merge(out.past_key_values, mask.to(self.device, torch.bool), new)
        self._advance(new, out.logits[:, -1, :], offset=len(self._active) - len(new))
        self.observer.step(len(self._active), len(new), time.perf_counter() - started)

    def _decode(self) -> None:
        import torch

        started = time.perf_counter()
        active = self._active
        if self._width == self._buffer.shape[1]:
            self._grow()
        self._width += 1
        mask = self._buffer[:, :self._width]
        if self.mask_4d:  # what transformers would build from the 2-D mask, minus its work
            mask = mask[:, None, None, :] if self._padded else None
        ids = torch.tensor([g.generated[-1] for g in active], device=self.device)[:, None]
        positions = self._lengths
        self._lengths = positions + 1
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         past_key_values=self._cache, use_cache=True)
        self._cache = out.past_key_values
        live = len(active)
        self._advance(list(active), out.logits[:, -1, :], offset=0)
        self.observer.step(live, live, time.perf_counter() - started)

    # --- tokens --------------------------------------------------------------------------------

    def _advance(self, rows: list[Generation], logits: Any, *, offset: int) -> None:
        """Choose each row's next token, emit it, and retire the rows that finished (*rows*
        are the batch's rows from *offset* on)."""
        tokens, logprobs, tops = choose(logits, rows)
        now = time.perf_counter()
        done: list[bool] | None = None
        intervals: list[float] = []
        observer = self.observer
        for i, (g, token, logprob) in enumerate(zip(rows, tokens, logprobs, strict=True)):
            if g.first_token_at is None:
                g.first_token_at = now
                observer.first_token(now - g.submitted_at)
            else:
                intervals.append(now - g.last_token_at)
            g.last_token_at = now
            if self._append(g, token, logprob, None if tops is None else tops[i]):
                observer.finished(now - g.submitted_at,
                                  "length" if g.finish is FinishReason.LENGTH else "stop")
                if done is None:
                    done = [False] * len(self._active)
                done[offset + i] = True
        if intervals:
            observer.inter_token(intervals)
        if done is not None:
            self._retire(done)

    def _append(self, g: Generation, token: int, logprob: float,
                top: list[tuple[int, float]] | None) -> bool:
        generated = g.generated
        generated.append(token)
        params = g.params
        finish: FinishReason | None = None
        if token in self.eos_ids:
            finish = FinishReason.EOS
        elif (len(generated) >= params.max_new_tokens
              or len(g.prompt_ids) + len(generated) >= self.max_model_len):
            finish = FinishReason.LENGTH
        new, g.prefix_offset, g.read_offset = detokenize(
            self.decode_text, generated, g.prefix_offset, g.read_offset, flush=finish is not None)
        text = g.text + new if new else g.text
        stops = params.stop
        if stops:
            cut = _find_stop(text, stops, g.sent)
            if cut is not None:
                text, finish = text[:cut], FinishReason.STOP
        g.text = text
        end = len(text) if finish is not None or not stops else _safe_end(text, stops)
        sent = g.sent
        delta = text[sent:end] if end > sent else ""
        if end > sent:
            g.sent = end
        g.finish = finish
        self._emit(g, TokenEvent(token, delta, logprob, token in self.special_ids, finish,
                                 text if finish is not None else None, top=top))
        return finish is not None

    def _fail_all(self, why: str) -> None:
        for g in [*self._active, *self._pending]:
            self.observer.finished(time.perf_counter() - g.submitted_at, "abort")
            self._emit(g, TokenEvent(-1, "", 0.0, False, error=why))
        self._active, self._cache, self._buffer, self._lengths = [], None, None, None
        self._pending.clear()

    # --- the KV cache and the mask -------------------------------------------------------------

    def _merge(self, cache: Any, mask: Any, new: list[Generation]) -> None:
        """Append *new* rows (their prefilled *cache*, their bool *mask*) to the live batch,
        left-padding the shorter of the two to the other's length."""
        if self._cache is None or not self._active:
            self._cache, self._active = cache, list(new)
            self._set_mask(mask)
            return
        length = max(self._width, mask.shape[1])
        for old, add in zip(self._cache.layers, cache.layers, strict=True):
            old.keys = _cat_rows(old.keys, add.keys, length)
            old.values = _cat_rows(old.values, add.values, length)
        self._set_mask(_cat_rows(self._mask, mask, length))
        self._active.extend(new)

    def _retire(self, done: list[bool]) -> None:
        """Remove the rows marked *done* from the batch and trim padding no row needs."""
        if not any(done):
            return
        import torch

        keep = [i for i, d in enumerate(done) if not d]
        self._active = [self._active[i] for i in keep]
        if not keep:
            self._cache = self._buffer = self._lengths = None
            return
        index = torch.tensor(keep, device=self.device)
        mask = self._mask[index]
        first = int(mask.any(0).int().argmax())
        for layer in self._cache.layers:
            layer.keys = layer.keys[index, :, first:, :]
            layer.values = layer.values[index, :, first:, :]
        self._set_mask(mask[:, first:])

    def _set_mask(self, mask: Any) -> None:
        """Make *mask* (rows x columns, bool) the live batch's, with room to grow."""
        import torch

        rows, width = mask.shape
        self._buffer = torch.ones((rows, width + _MASK_HEADROOM), dtype=torch.bool,
                                  device=mask.device)
        self._buffer[:, :width] = mask
        self._width = width
        self._lengths = mask.sum(-1, keepdim=True)
        # left padding only: some row is padded exactly when the first column is not all real
        self._padded = not bool(mask[:, 0].all())

    def _grow(self) -> None:
        self._set_mask(self._mask)


def _prefill_groups(new: list[Generation]) -> list[list[Generation]]:
    """*new* by prompt length, cut into groups of at most ``_PREFILL_TOKENS`` padded tokens
    (one prompt at least). A burst of ordinary prompts is one group: one forward call, whose
    cost on a small model is mostly per call, gives all their first tokens at once (groups of
    96 tokens, tried before, made the later groups of a burst of 16 wait for the earlier
    ones); only long prompts are split off, shortest first, to bound the padding."""
    groups: list[list[Generation]] = []
    group: list[Generation] = []
    for g in sorted(new, key=lambda g: len(g.prompt_ids)):
        if group and (len(group) + 1) * len(g.prompt_ids) > _PREFILL_TOKENS:
            groups.append(group)
            group = []
        group.append(g)
    if group:
        groups.append(group)
    return groups


def detokenize(decode: Callable[[list[int]], str], ids: list[int], prefix_offset: int,
               read_offset: int, *, flush: bool = False) -> tuple[str, int, int]:
    """Incremental detokenization: the text the tokens after *read_offset* add, and the new
    offsets. The tokens from *prefix_offset* to *read_offset* are decoded with them as
    context (a word-start marker or byte sequence reads differently alone), so each step
    decodes a few tokens instead of all. Text ending in U+FFFD (half a UTF-8 character) is held
    until the character completes, or *flush*. The pieces join to ``decode(ids)`` for
    byte-level BPE and SentencePiece-style (metaspace, byte fallback) tokenizers."""
    before = decode(ids[prefix_offset:read_offset]) if read_offset > prefix_offset else ""
    after = decode(ids[prefix_offset:])
    if len(after) > len(before) and (flush or after[-1] != "\ufffd"):
        return after[len(before):], read_offset, len(ids)
    if flush and after != before:
        return after[len(before):], prefix_offset, read_offset
    return "", prefix_offset, read_offset


def _cat_rows(a: Any, b: Any, length: int) -> Any:
    """Rows of *a* then *b*, each left-padded with zeros to *length* along the sequence axis
    (the last axis of a mask, the one before last of keys and values)."""
    import torch
    import torch.nn.functional as F

    def pad(x: Any) -> Any:
        missing = length - x.shape[-1 if x.dim() == 2 else -2]
        if missing == 0:
            return x
        return F.pad(x, (missing, 0)) if x.dim() == 2 else F.pad(x, (0, 0, missing, 0))

    return torch.cat([pad(a), pad(b)], dim=0)


def _find_stop(text: str, stops: tuple[str, ...], sent: int) -> int | None:
    """Where the earliest stop sequence starts in *text* (text before *sent* holds none)."""
    best: int | None = None
    for stop in stops:
        at = text.find(stop, max(0, sent - len(stop) + 1))
        if at >= 0 and (best is None or at < best):
            best = at
    return best


def _safe_end(text: str, stops: tuple[str, ...]) -> int:
    """How much of *text* can be sent now: not a trailing partial character (U+FFFD from an
    incomplete UTF-8 sequence), nor a tail that may be the start of a stop sequence."""
    end = len(text)
    while end > 0 and text[end - 1] == "\ufffd":
        end -= 1
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, end), 0, -1):
            if text[end - n:end] == stop[:n]:
                hold = max(hold, n)
                break
    return end - hold


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos is not None:
        ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def _text_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """``tokenizer.decode(ids, skip_special_tokens=True)``, calling the Rust tokenizer
    directly when that is all transformers' ``decode`` would do (its wrapper costs more than
    decoding a few tokens)."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend as Fast
    except ImportError:  # older transformers
        from transformers import PreTrainedTokenizerFast as Fast

    cls = type(tokenizer)
    backend: Any = getattr(tokenizer, "_tokenizer", None)
    cleanup = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    if cleanup and type(getattr(backend, "model", None)).__name__ == "BPE":
        # transformers skips the clean-up for BPE models unless forced
        cleanup = bool(getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_"
                                          "it_will_corrupt_output", False))
    if (isinstance(tokenizer, Fast) and not cleanup and hasattr(backend, "decode")
            and getattr(cls, "_decode", None) is getattr(Fast, "_decode", None)
            and getattr(cls, "decode", None) is getattr(Fast, "decode", None)):
        rust_decode = backend.decode

        def fast(ids: list[int]) -> str:
            return str(rust_decode(ids, skip_special_tokens=True))
        return fast

    def slow(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))
    return slow


def _takes_4d_mask(model: Any) -> bool:
    """Whether a decode step may pass the 4-D boolean mask itself: SDPA attention (a boolean
    mask means "attend") and one full-attention pattern for every layer (no sliding window or
    chunked attention, which transformers would build into the mask)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if getattr(config, "is_encoder_decoder", False):
        return False
    if getattr(config, "sliding_window", None) is not None \
            or getattr(config, "attention_chunk_size", None) is not None:
        return False
    layer_types = getattr(config, "layer_types", None)
    return not layer_types or all(t == "full_attention" for t in layer_types)
