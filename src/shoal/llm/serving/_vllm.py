"""``option.rolling_batch=vllm`` / ``engine=vllm``: vLLM's engine behind the interface of the
built-in one (``submit``/``on_event``/``on_step``), so the routes, streaming and metrics are the
same. vLLM is imported when the model loads, never before; it needs a GPU machine with vllm
installed, and ``_loading`` refuses the option with a clear message where it is missing.

vLLM's synchronous ``LLMEngine`` is driven from the engine's thread (``add_request``, ``step``,
``abort_request``), as the transformers engine's loop is: vLLM schedules, batches, pages the KV
cache, detokenizes and applies stop strings; this module translates its cumulative
``RequestOutput``s into ``TokenEvent``s.

Not exercised on the machines this project is tested on (no GPU, and vllm does not install);
the parameter mapping and the translation are unit-tested against a stand-in.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from shoal.llm.serving._engine import (
    EngineLoop,
    EngineObserver,
    FinishReason,
    Generation,
    TokenEvent,
)
from shoal.llm.serving._params import GenerationParams
from shoal.llm.serving._properties import LlmServingOptions, Quantize

__all__ = ["VllmEngine", "engine_arguments", "sampling_arguments"]

log = logging.getLogger(__name__)


def sampling_arguments(params: GenerationParams, seed: int | None) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments for *params* (greedy is temperature 0; vLLM
    disables top-k with -1). The chosen token's log-probability is asked for (``logprobs=0``),
    special tokens are left out of the text and stop strings out of the output, as the
    transformers engine does; with ``top_logprobs`` that many alternatives."""
    arguments: dict[str, Any] = {
        "n": 1, "max_tokens": params.max_new_tokens, "stop": list(params.stop),
        "include_stop_str_in_output": False, "repetition_penalty": params.repetition_penalty,
        "skip_special_tokens": True, "logprobs": params.top_logprobs}
    if params.presence_penalty or params.frequency_penalty:
        arguments.update(presence_penalty=params.presence_penalty,
                         frequency_penalty=params.frequency_penalty)
    if params.logit_bias:
        arguments["logit_bias"] = dict(params.logit_bias)
    if params.do_sample:
        arguments.update(temperature=params.temperature, top_p=params.top_p,
                         top_k=params.top_k if params.top_k > 0 else -1, seed=seed)
    else:
        arguments.update(temperature=0.0, top_p=1.0, top_k=-1)
    return arguments


def engine_arguments(options: LlmServingOptions, model_path: str, gpus: int) -> dict[str, Any]:
    """vLLM ``EngineArgs`` keyword arguments for *options* (``tensor_parallel_degree`` max:
    every GPU)."""
    arguments: dict[str, Any] = {
        "model": model_path, "tokenizer": model_path,
        "tensor_parallel_size": options.tensor_parallel_degree or max(1, gpus),
        "dtype": options.dtype, "max_num_seqs": options.batch_size,
        "trust_remote_code": options.trust_remote_code}
    if options.max_model_len is not None:
        arguments["max_model_len"] = options.max_model_len
    if options.quantize is not None:
        arguments["quantization"] = "bitsandbytes"
        if options.quantize is not Quantize.BITSANDBYTES4:
            log.warning("vLLM quantizes bitsandbytes to 4 bits; option.quantize=%s asked for 8",
                        options.quantize.value)
    return arguments


def _finish(output: Any) -> FinishReason | None:
    reason = getattr(output, "finish_reason", None)
    if reason is None:
        return None
    if reason == "length":
        return FinishReason.LENGTH
    # "stop": a stop string (stop_reason is it), or EOS / a stop token (None or an id)
    return FinishReason.STOP if isinstance(getattr(output, "stop_reason", None), str) \
        else FinishReason.EOS


class VllmEngine(EngineLoop):
    """vLLM's ``LLMEngine`` (*llm*) with the transformers engine's interface."""

    thread_name = "shoal-llm-vllm"

    def __init__(self, llm: Any, sampling_params: Callable[..., Any], *, max_queue: int,
                 special_ids: set[int], observer: EngineObserver | None = None,
                 on_step: Callable[[], None] | None = None) -> None:
        super().__init__(max_queue=max_queue, observer=observer, on_step=on_step)
        self.llm = llm
        self.sampling_params = sampling_params
        self.special_ids = special_ids
        self._running: dict[str, Generation] = {}
        self._emitted: dict[str, int] = {}  # tokens already sent, per request

    @property
    def queue_depth(self) -> int:
        """Requests not decoding yet (ours, and those vLLM has not scheduled)."""
        return len(self._pending) + sum(1 for g in list(self._running.values())
                                        if g.first_token_at is None)

    @property
    def live(self) -> int:
        return sum(1 for g in list(self._running.values()) if g.first_token_at is not None)

    def _accepted(self, generation: Generation) -> None:
        if generation.params.do_sample and generation.seed is None:
            generation.seed = random.randrange(2**63)

    # --- the loop (the engine's thread) ----------------------------------------------------

    def _has_work(self) -> bool:
        return bool(self._running)

    def _take(self) -> list[Generation]:
        new = list(self._pending)
        self._pending.clear()
        return new

    def _work(self, new: list[Generation]) -> None:
        """Hand *new* to vLLM, abort the cancelled, run one vLLM step."""
        try:
            for g in new:
                if g.cancelled:
                    continue
                request_id = str(g.id)
                self.llm.add_request(request_id, {"prompt_token_ids": g.prompt_ids},
                                     self.sampling_params(**sampling_arguments(g.params, g.seed)))
                self._running[request_id] = g
                self._emitted[request_id] = 0
                self.observer.prefilled(len(g.prompt_ids))
            gone = [r for r, g in self._running.items() if g.cancelled]
            if gone:
                self.llm.abort_request(gone)
                for request_id in gone:
                    self._forget(request_id)
            if self._running:
                started = time.perf_counter()
                tokens = sum(self._translate(output) for output in self.llm.step())
                self.observer.step(len(self._running), tokens, time.perf_counter() - started)
        except Exception as e:  # vLLM failed: fail what runs, keep serving
            log.exception("the vLLM step failed; failing the %d live requests",
                          len(self._running))
            self._fail_running(f"{type(e).__name__}: {e}")

    def _translate(self, result: Any) -> int:
        """Events for one ``RequestOutput`` (cumulative: all tokens and text so far)."""
        request_id = str(result.request_id)
        g = self._running.get(request_id)
        if g is None or not result.outputs:
            return 0
        output = result.outputs[0]
        token_ids = list(output.token_ids)
        done = self._emitted[request_id]
        new = token_ids[done:]
        finish = _finish(output) if result.finished else None
        text: str = output.text or ""
        if not new and finish is None:
            return 0
        now = time.perf_counter()
        if g.first_token_at is None:
            g.first_token_at = now
            self.observer.first_token(now - g.submitted_at)
        elif new:  # the tokens of this step share its interval
            self.observer.inter_token([(now - g.last_token_at) / len(new)] * len(new))
        g.last_token_at = now
        delta = text[g.sent:] if len(text) > g.sent else ""
        g.sent = max(g.sent, len(text))
        logprobs = getattr(output, "logprobs", None) or []
        if not new:  # finished without a new token (rare): close with an empty event
            new, delta_token = [token_ids[-1] if token_ids else -1], True
        else:
            delta_token = False
        for i, token in enumerate(new):
            last = i == len(new) - 1
            position = done + i
            logprob, top = 0.0, None
            if not delta_token and position < len(logprobs) and logprobs[position]:
                entries = logprobs[position]
                entry = entries.get(token)
                logprob = float(getattr(entry, "logprob", 0.0)) if entry is not None else 0.0
                if g.params.top_logprobs:
                    ranked = sorted(((int(t), float(e.logprob)) for t, e in entries.items()),
                                    key=lambda te: -te[1])
                    top = ranked[:g.params.top_logprobs]
            event = TokenEvent(token, delta if last else "", logprob, token in self.special_ids,
                               finish if last else None, text if last and finish else None,
                               top=top)
            self._emit(g, event)
        self._emitted[request_id] = len(token_ids)
        g.generated = token_ids
        if finish is not None:
            g.finish = finish
            self.observer.finished(now - g.submitted_at,
                                   "length" if finish is FinishReason.LENGTH else "stop")
            self._forget(request_id)
        return 0 if delta_token else len(new)

    def _forget(self, request_id: str) -> None:
        self._running.pop(request_id, None)
        self._emitted.pop(request_id, None)

    def _fail_running(self, why: str) -> None:
        running = list(self._running)
        for request_id in running:
            self._emit(self._running[request_id], TokenEvent(-1, "", 0.0, False, error=why))
        if running:
            try:
                self.llm.abort_request(running)
            except Exception:
                log.exception("aborting the failed requests in vLLM failed")
        self._running.clear()
        self._emitted.clear()

    def _fail_all(self, why: str) -> None:
        self._fail_running(why)
        for g in self._pending:
            self._emit(g, TokenEvent(-1, "", 0.0, False, error=why))
        self._pending.clear()


def load_vllm(options: LlmServingOptions, model_path: str, observer: EngineObserver
              ) -> tuple[VllmEngine, Any, int, str]:
    """vLLM's engine for the model at *model_path*: the engine, its tokenizer, the length
    limit and a description. Raises vLLM's own errors (the caller wraps them)."""
    import torch
    from vllm import EngineArgs, LLMEngine, SamplingParams

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    arguments = engine_arguments(options, model_path, gpus)
    llm = LLMEngine.from_engine_args(EngineArgs(**arguments))
    tokenizer = llm.get_tokenizer()
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # older vllm wraps it in a group
    config = getattr(llm, "model_config", None) or llm.get_model_config()
    max_len = int(config.max_model_len)
    special = set(getattr(tokenizer, "all_special_ids", ()))
    engine = VllmEngine(llm, SamplingParams, max_queue=options.job_queue_size,
                        special_ids=special, observer=observer)
    description = (f"vLLM engine for {model_path} (tensor_parallel_size "
                   f"{arguments['tensor_parallel_size']}, dtype {options.dtype}, up to "
                   f"{options.batch_size} sequences), max_model_len {max_len}")
    return engine, tokenizer, max_len, description
