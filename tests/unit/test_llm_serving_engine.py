"""The LLM server's engine pieces that need no model: incremental detokenization (the streamed
pieces join to the whole decode, for byte-level BPE and SentencePiece-style tokenizers), and
the vLLM adapter: the clear refusal of engine=vllm where vllm is missing (and LMI's vLLM
values served by the transformers engine, said once), the mapping of shoal's generation
parameters and serving.properties onto vLLM's, and its outputs turned into token events (against
a stand-in for vLLM's engine)."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shoal.errors import ModelLoadError
from shoal.llm.serving._engine import EngineObserver, FinishReason, TokenEvent, detokenize
from shoal.llm.serving._params import GenerationParams, from_lmi
from shoal.llm.serving._properties import load_serving_options

TEXTS = ["The shoal swims past the reef.", "Caf\u00e9 cr\u00e8me, na\u00efve \u00fcber",
         "\u4e2d\u6587\u7684\u6d4b\u8bd5 \u3068 \u65e5\u672c\u8a9e", "emoji \U0001f41f\U0001f30a ok",
         "  spaces   and\ttabs\nnew lines  "]


def _byte_level() -> Any:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he")]  # a few multi-byte tokens
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["</s>"])
    return tok


def _sentencepiece_style() -> Any:
    """Llama-2-like: metaspace word starts, byte fallback for what the vocabulary lacks."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"<unk>": 0}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ("\u2581", "\u2581The", "\u2581shoal", "s", "w", "i", "m", "\u2581the", "e",
                  "a", "r", "f", ".", "C", "c", "\u2581c", "n", "o", "k", "p", "t", "h", "l"):
        vocab.setdefault(piece, len(vocab))
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>",
                                          byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["</s>"])
    return tok


@pytest.mark.parametrize("make", [_byte_level, _sentencepiece_style])
def test_incremental_detokenization_joins_to_the_whole_decode(make):
    tok = make()
    special = tok.token_to_id("</s>")

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    def stream(sequence: list[int]) -> list[str]:
        pieces, start, read = [], 0, 0
        for n in range(1, len(sequence) + 1):
            last = n == len(sequence)
            new, start, read = detokenize(decode, sequence[:n], start, read, flush=last)
            assert "\ufffd" not in new or last  # half characters are held back
            pieces.append(new)
        return pieces

    rng = random.Random(0)
    for text in TEXTS:
        ids = tok.encode(text).ids
        whole = [n for n in range(1, len(ids) + 1) if not decode(ids[:n]).endswith("\ufffd")]
        for cut in {len(ids), *rng.sample(whole, min(4, len(whole)))}:
            sequence = list(ids[:cut])
            if cut > 2:  # a special token spliced in (skipped)
                sequence.insert(cut // 2, special)
            assert "".join(stream(sequence)) == decode(sequence), (text, cut)
        # ending inside a character: what was complete, then the replacement character
        if len(whole) < len(ids):
            cut = next(n for n in range(1, len(ids) + 1) if n not in whole)
            joined = "".join(stream(ids[:cut]))
            complete = decode(ids[:max((n for n in whole if n < cut), default=0)])
            assert joined.startswith(complete) and joined.endswith("\ufffd")


# --- vLLM ----------------------------------------------------------------------------------


@pytest.fixture
def no_vllm(monkeypatch):
    """vllm not installed (it is not on these machines; this makes sure of it)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))


def test_engine_vllm_without_the_package_fails_at_load_naming_the_key(tmp_path, no_vllm):
    from shoal.llm.serving._loading import load_model

    (tmp_path / "serving.properties").write_text("engine=vllm\n")
    with pytest.raises(ModelLoadError) as info:
        load_model(load_serving_options(tmp_path, {}), EngineObserver())
    message = str(info.value)
    assert "engine=vllm" in message and "vllm package" in message and "engine=Python" in message


@pytest.mark.parametrize("line", ["option.rolling_batch=vllm",
                                  "option.entryPoint=djl_python.lmi_vllm.vllm_async_service"])
def test_vllm_asked_by_lmi_falls_back_to_the_transformers_engine_and_says_so(
        tmp_path, line, no_vllm, caplog):
    from shoal.llm.serving._loading import _use_vllm

    (tmp_path / "serving.properties").write_text(line + "\n")
    with caplog.at_level(logging.WARNING):
        assert _use_vllm(load_serving_options(tmp_path, {})) is False
    said = [r.getMessage() for r in caplog.records if "vllm package is not installed" in
            r.getMessage()]
    assert len(said) == 1 and line.partition("=")[0] in said[0]
    strict = load_serving_options(tmp_path, {"OPTION_SHOAL_STRICT": "true"})
    with pytest.raises(ModelLoadError, match="option.shoal_strict=true refuses this"):
        _use_vllm(strict)


def test_generation_parameters_map_onto_vllm_sampling():
    from shoal.llm.serving._vllm import sampling_arguments

    greedy = sampling_arguments(from_lmi({"max_new_tokens": 7, "stop": ["\n"]}), None)
    assert greedy == {"n": 1, "max_tokens": 7, "stop": ["\n"], "include_stop_str_in_output": False,
                      "repetition_penalty": 1.0, "skip_special_tokens": True, "logprobs": 0,
                      "temperature": 0.0, "top_p": 1.0, "top_k": -1}
    sampled = sampling_arguments(from_lmi({"temperature": 0.7, "top_p": 0.9, "top_k": 40,
                                           "repetition_penalty": 1.2}), 11)
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"], sampled["seed"],
            sampled["repetition_penalty"]) == (0.7, 0.9, 40, 11, 1.2)
    assert sampling_arguments(GenerationParams(do_sample=True), 3)["top_k"] == -1


def test_serving_properties_map_onto_vllm_engine_arguments(tmp_path):
    from shoal.llm.serving._vllm import engine_arguments

    (tmp_path / "serving.properties").write_text(
        "engine=vllm\noption.dtype=bf16\noption.max_rolling_batch_size=64\n"
        "option.max_model_len=4096\noption.tensor_parallel_degree=2\n"
        "option.trust_remote_code=true\n")
    args = engine_arguments(load_serving_options(tmp_path, {}), "/models/m", gpus=8)
    assert args == {"model": "/models/m", "tokenizer": "/models/m", "tensor_parallel_size": 2,
                    "dtype": "bfloat16", "max_num_seqs": 64, "trust_remote_code": True,
                    "max_model_len": 4096}
    (tmp_path / "serving.properties").write_text("option.rolling_batch=vllm\n"
                                                 "option.quantize=bitsandbytes4\n")
    args = engine_arguments(load_serving_options(tmp_path, {}), "/m", gpus=4)
    assert args["tensor_parallel_size"] == 4 and args["quantization"] == "bitsandbytes"
    assert "max_model_len" not in args


class _FakeLLMEngine:
    """vLLM's LLMEngine as far as the adapter uses it: each step adds one token (and its
    text) to every request; cumulative outputs."""

    def __init__(self, script: dict[str, list[tuple[int, str]]], finish: dict[str, Any]) -> None:
        self.script, self.finish = script, finish
        self.requests: dict[str, int] = {}
        self.aborted: list[str] = []
        self.sampling: dict[str, Any] = {}

    def add_request(self, request_id: str, prompt: dict[str, Any], params: Any) -> None:
        assert prompt == {"prompt_token_ids": [1, 2, 3]}
        self.requests[request_id] = 0
        self.sampling[request_id] = params

    def abort_request(self, ids: list[str]) -> None:
        self.aborted += ids
        for i in ids:
            self.requests.pop(i, None)

    def step(self) -> list[Any]:
        outputs = []
        for request_id in list(self.requests):
            n = self.requests[request_id] = self.requests[request_id] + 1
            steps = self.script[request_id][:n]
            finished = n == len(self.script[request_id])
            reason, stop = self.finish[request_id] if finished else (None, None)
            output = SimpleNamespace(
                token_ids=[t for t, _ in steps], text="".join(s for _, s in steps),
                finish_reason=reason, stop_reason=stop,
                logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t, _ in steps])
            outputs.append(SimpleNamespace(request_id=request_id, outputs=[output],
                                           finished=finished))
            if finished:
                del self.requests[request_id]
        return outputs


def test_vllm_outputs_become_token_events_and_cancel_aborts():
    from shoal.llm.serving._vllm import VllmEngine

    # vLLM trims a stop string from the text itself: request 2 stops on "b"
    script = [[(10, "Hel"), (11, "lo"), (2, "")], [(12, "a"), (13, "")], [(14, "x")] * 5]
    finish = [("stop", None), ("stop", "b"), ("length", None)]
    fake = _FakeLLMEngine({}, {})
    steps = []
    engine = VllmEngine(fake, lambda **kw: kw, max_queue=4, special_ids={2},
                        on_step=lambda: steps.append(1))
    got: dict[int, list[TokenEvent]] = {}
    generations = []
    for params in (GenerationParams(max_new_tokens=3), GenerationParams(stop=("b",)),
                   GenerationParams(do_sample=True, temperature=0.5)):
        events: list[TokenEvent] = []
        g = engine.submit([1, 2, 3], params, events.append)
        got[g.id] = events
        generations.append(g)
    # vLLM's request ids are the generations' ids
    fake.script = {str(g.id): s for g, s in zip(generations, script, strict=True)}
    fake.finish = {str(g.id): f for g, f in zip(generations, finish, strict=True)}
    assert engine.queue_depth == 3
    engine._iteration()
    assert engine.live == 3 and engine.queue_depth == 0
    assert fake.sampling[str(generations[2].id)]["seed"] == generations[2].seed is not None
    engine._iteration()
    generations[2].cancel()
    engine._iteration()
    assert fake.aborted == [str(generations[2].id)] and engine.live == 0
    first, second, third = (got[g.id] for g in generations)
    assert [(e.token_id, e.text, e.finish) for e in first] == [
        (10, "Hel", None), (11, "lo", None), (2, "", FinishReason.EOS)]
    assert first[-1].generated_text == "Hello" and first[-1].special and first[0].logprob == -0.5
    assert [(e.token_id, e.text, e.finish) for e in second] == [
        (12, "a", None), (13, "", FinishReason.STOP)]
    assert second[-1].generated_text == "a"
    assert [e.finish for e in third] == [None, None] and len(steps) == 3


def test_vllm_is_imported_only_when_the_model_loads():
    import sys

    import shoal.llm.serving._loading  # noqa: F401
    import shoal.llm.serving._vllm  # noqa: F401

    assert "vllm" not in sys.modules
    assert Path(shoal.llm.serving._vllm.__file__).name == "_vllm.py"


def test_a_burst_is_one_prefill_and_only_long_prompts_are_split_off():
    from shoal.llm.serving._engine import _PREFILL_TOKENS, Generation, _prefill_groups

    def burst(lengths: list[int]) -> list[list[Generation]]:
        new = [Generation([1] * n, GenerationParams(), lambda e: None) for n in lengths]
        groups = _prefill_groups(new)
        assert sorted(g.id for group in groups for g in group) == sorted(g.id for g in new)
        return groups

    ordinary = [20, 3, 18, 5, 19, 4, 30, 2, 12, 7, 9, 11, 14, 16, 6, 8]  # 16 prompts
    assert [len(group) for group in burst(ordinary)] == [16]
    long = _PREFILL_TOKENS // 2 + 1  # two of these do not fit one call
    groups = burst([20, 3, long, 18, long])
    flat = [len(g.prompt_ids) for group in groups for g in group]
    assert flat == sorted(flat)  # shortest first: the short ones do not wait for the long
    for group in groups:  # within the budget of padded tokens, or one long prompt alone
        longest = max(len(g.prompt_ids) for g in group)
        assert len(group) * longest <= _PREFILL_TOKENS or len(group) == 1
    assert [[len(g.prompt_ids) for g in group] for group in groups] == [[3, 18, 20], [long],
                                                                        [long]]
