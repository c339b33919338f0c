"""OpenAI's API as vLLM serves it (issue #19 items 3 and 4), through the real ``openai`` client
against the LLM server on a tiny random-init Llama (and a tiny BERT for embeddings), over real
HTTP: served model names and 404 for others; ``n``, ``logprobs``, ``seed``, ``stop``, the
penalties and ``logit_bias`` checked against the model's own logits; what the server cannot
honour is a 400 in OpenAI's error shape; vLLM's ``/tokenize``, ``/detokenize``, ``/health``,
``/version``; ``/v1/embeddings``; vLLM's metric names with values that add up. Every answer is
validated against the ``openai.types`` models."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

from openai.types import Completion, CreateEmbeddingResponse, Model  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402

from llm_models import (  # noqa: E402
    CHAT_TEMPLATE,
    MAX_POSITIONS,
    Reference,
    ThreadServer,
    make_tiny_llm,
)
from shoal.llm.serving import LlmServerApp, load_serving_options  # noqa: E402
from shoal.serving import ServerOptions  # noqa: E402

#: the test template shows the tools it is given (so /tokenize and the answer reflect them)
TOOLS_TEMPLATE = CHAT_TEMPLATE + "{% if tools %}<s>tools: {{ tools | length }}\n{% endif %}"
PROMPT = "A reef"  # greedy: 24 tokens before any EOS
N = 10
NAMES = ("tiny", "tiny-alias")
TOOLS = [{"type": "function", "function": {"name": "f", "description": "d",
                                            "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llm(tmp_path_factory.mktemp("llm") / "model", chat_template=TOOLS_TEMPLATE,
                         option_max_rolling_batch_size=8)


@pytest.fixture(scope="module")
def ref(model_dir: Path) -> Reference:
    return Reference(model_dir)


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[ThreadServer]:
    app = LlmServerApp(load_serving_options(model_dir, {}),
                       ServerOptions(port=0, served_model_name=NAMES))
    with ThreadServer(app) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ThreadServer) -> Any:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _valid(cls: Any, raw: Any) -> Any:
    """The answer's JSON validated (not merely constructed) as *cls*."""
    return cls.model_validate(json.loads(raw.http_response.text))


def _greedy(ref: Reference, prompt: str, n: int, *, presence: float = 0.0,
            frequency: float = 0.0, bias: dict[int, float] | None = None) -> tuple[
                list[int], list[Any]]:
    """Greedy decoding by hand on the reference model, with vLLM's penalties on the output
    tokens and *bias* on the logits: the token ids and each step's raw log-probabilities."""
    import torch

    ids = ref.ids(prompt)
    out: list[int] = []
    steps = []
    eos = ref.tokenizer.eos_token_id
    with torch.no_grad():
        for _ in range(n):
            logits = ref.model(torch.tensor([ids + out])).logits[0, -1].float()
            steps.append(torch.log_softmax(logits, -1))
            for token, b in (bias or {}).items():
                logits[token] += b
            if out:
                counts = torch.bincount(torch.tensor(out), minlength=logits.shape[0]).float()
                logits = logits - frequency * counts - presence * (counts > 0).float()
            token = int(logits.argmax())
            out.append(token)
            if token == eos:
                break
    return out, steps


def test_served_names_are_listed_and_other_models_get_404(server, client):
    listed = client.models.with_raw_response.list()
    data = json.loads(listed.http_response.text)["data"]
    assert [Model.model_validate(m).id for m in data] == list(NAMES)
    assert data[0]["max_model_len"] == MAX_POSITIONS
    for name in NAMES:  # either name serves
        assert client.completions.create(model=name, prompt=PROMPT, max_tokens=2).choices
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="model", prompt=PROMPT, max_tokens=2)
    assert info.value.status_code == 404
    raw = httpx.post(server.url + "/v1/chat/completions", json={
        "model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]})
    error = raw.json()["error"]
    assert raw.status_code == 404 and set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)
    assert "gpt-4" in error["message"] and "'tiny'" in error["message"]


def test_n_choices_and_logprobs_match_the_model(client, ref):
    want_ids, steps = _greedy(ref, PROMPT, N)
    want = ref.tokenizer.decode(want_ids, skip_special_tokens=True)
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt=PROMPT, max_tokens=N, temperature=0, n=3, logprobs=3)
    done = _valid(Completion, raw)
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert {c.text for c in done.choices} == {want}
    assert done.usage.prompt_tokens == len(ref.ids(PROMPT))  # the prompt counts once
    assert done.usage.completion_tokens == 3 * len(want_ids)
    logprobs = done.choices[0].logprobs
    assert logprobs.tokens == [ref.tokenizer.decode([t]) for t in want_ids]
    for k, (token, lp, top) in enumerate(zip(want_ids, logprobs.token_logprobs,
                                             logprobs.top_logprobs, strict=True)):
        assert math.isclose(lp, float(steps[k][token]), abs_tol=1e-4), k
        # the chosen token and the 3 likeliest, by their text (vLLM's dict: equal texts merge)
        likeliest = {ref.tokenizer.decode([t]) for t in steps[k].topk(3).indices.tolist()}
        assert set(top) == likeliest | {logprobs.tokens[k]}
        assert max(top.values()) == pytest.approx(lp, abs=1e-6)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset[1] == len(logprobs.tokens[0])

    messages = [{"role": "user", "content": "A reef answers"}]
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_tokens=N, temperature=0, logprobs=True,
        top_logprobs=2)
    chat = _valid(ChatCompletion, raw)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert "".join(c.token for c in content).startswith(chat.choices[0].message.content)
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.bytes == list(entry.token.encode())
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)


def test_a_seed_makes_sampling_repeatable_and_n_seeds_each_choice(client):
    def sample(seed: int, n: int = 1) -> list[str]:
        answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=N,
                                           temperature=1.0, seed=seed, n=n)
        return [c.text for c in answer.choices]

    first = sample(7)
    assert sample(7) == first
    assert len({sample(s)[0] for s in range(7, 12)}) > 1  # other seeds, other samples
    assert sample(7, n=2) == [first[0], sample(8)[0]]  # choice i is seeded seed + i (vLLM)


def test_stop_penalties_and_logit_bias_change_the_answer_as_vllm_applies_them(client, ref):
    full_ids, _ = _greedy(ref, PROMPT, 24)
    full = ref.tokenizer.decode(full_ids, skip_special_tokens=True)
    stop = next(full[i:i + 3] for i in range(4, len(full) - 3)
                if full.find(full[i:i + 3]) == i and full[i:i + 3].strip())
    answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24,
                                       temperature=0, stop=[stop, "never-there"])
    assert answer.choices[0].text == full[:full.find(stop)]
    assert answer.choices[0].finish_reason == "stop"

    for presence, frequency in ((1.5, 0.0), (0.0, 2.0), (-0.5, 1.0)):
        ids, _ = _greedy(ref, PROMPT, 24, presence=presence, frequency=frequency)
        got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24,
                                        temperature=0, presence_penalty=presence,
                                        frequency_penalty=frequency)
        assert got.choices[0].text == ref.tokenizer.decode(ids, skip_special_tokens=True)
    penalised, _ = _greedy(ref, PROMPT, 24, frequency=2.0)
    assert penalised != full_ids  # the penalties did change this answer

    banned = full_ids[0]
    bias = {banned: -100.0, full_ids[1]: 5.0}
    ids, _ = _greedy(ref, PROMPT, N, bias=bias)
    got = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=N, temperature=0,
                                    logit_bias={str(k): v for k, v in bias.items()})
    assert got.choices[0].text == ref.tokenizer.decode(ids, skip_special_tokens=True)
    assert banned not in ids
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model="tiny", prompt=PROMPT, logit_bias={"99999": 1})


def test_streamed_choices_join_to_the_whole_answers(client):
    messages = [{"role": "user", "content": "Every job batches"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=N,
                                           temperature=1.0, seed=3, n=2)
    pieces: dict[int, str] = {0: "", 1: ""}
    finished: dict[int, str | None] = {}
    with client.chat.completions.with_streaming_response.create(
            model="tiny", messages=messages, max_tokens=N, temperature=1.0, seed=3, n=2,
            stream=True, logprobs=True) as raw:
        for line in raw.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = ChatCompletionChunk.model_validate(json.loads(line[6:]))
            for choice in chunk.choices:
                pieces[choice.index] += choice.delta.content or ""
                if choice.finish_reason is not None:
                    finished[choice.index] = choice.finish_reason
    assert pieces == {c.index: c.message.content for c in whole.choices}
    assert finished == {c.index: c.finish_reason for c in whole.choices}


def test_what_cannot_be_honoured_is_a_400_naming_the_field(server, client, ref):
    messages = [{"role": "user", "content": "hi"}]
    cases = [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object"}}}}, "response_format"),
        ({"tools": TOOLS}, "tool_choice"),  # "auto" needs a tool-call parser
        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
        ({"n": 0}, "n"),
        ({"frobnicate": 1}, "frobnicate"),
    ]
    for extra, param in cases:
        raw = httpx.post(server.url + "/v1/chat/completions",
                         json={"model": "tiny", "messages": messages, **extra})
        assert raw.status_code == 400, (extra, raw.text)
        error = raw.json()["error"]
        assert (error["param"], error["type"], error["code"]) == (param, "BadRequestError",
                                                                  400), extra
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model="tiny", messages=messages,
                                       response_format={"type": "json_object"})
    for extra in ({"suffix": "x"}, {"best_of": 2}, {"echo": True, "logprobs": 1}):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, **extra)

    # tool_choice "none": the template is given the tools, the answer is text
    with_tools = ref.tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False,
                                                   add_generation_prompt=True)
    assert "tools: 1" in with_tools
    answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=N,
                                            temperature=0, tools=TOOLS, tool_choice="none")
    assert answer.choices[0].message.content == ref.text(with_tools, N, chat=True)
    echoed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=N,
                                       temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + ref.text(PROMPT, N)


def test_tokenize_detokenize_health_and_version(server, ref):
    url = server.url
    got = httpx.post(url + "/tokenize", json={"model": "tiny", "prompt": PROMPT,
                                              "return_token_strs": True}).json()
    ids = ref.ids(PROMPT)
    assert got == {"count": len(ids), "max_model_len": MAX_POSITIONS, "tokens": ids,
                   "token_strs": ref.tokenizer.convert_ids_to_tokens(ids)}
    plain = httpx.post(url + "/tokenize", json={"prompt": PROMPT,
                                                "add_special_tokens": False}).json()
    assert plain["tokens"] == ref.ids(PROMPT, chat=True) and plain["token_strs"] is None
    messages = [{"role": "user", "content": "A reef"}]
    chat = httpx.post(url + "/tokenize", json={"messages": messages}).json()
    assert chat["tokens"] == ref.ids(ref.chat_prompt(messages), chat=True)
    tools = httpx.post(url + "/tokenize", json={"messages": messages, "tools": TOOLS,
                                                "tool_choice": "none"}).json()
    assert tools["count"] > chat["count"]
    back = httpx.post(url + "/detokenize", json={"model": "tiny", "tokens": ids}).json()
    assert back == {"prompt": ref.tokenizer.decode(ids)}
    bad = httpx.post(url + "/detokenize", json={"tokens": [10**6]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    unknown = httpx.post(url + "/tokenize", json={"model": "other", "prompt": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    health = httpx.get(url + "/health")
    assert health.status_code == 200 and health.content == b""
    from shoal import __version__

    assert httpx.get(url + "/version").json() == {"version": __version__}


def test_a_causal_model_refuses_embeddings(client):
    with pytest.raises(openai.BadRequestError, match="does not support Embeddings"):
        client.embeddings.create(model="tiny", input="A reef")


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def test_vllm_metrics_add_up_to_what_was_generated(server, client):
    labels = (("engine", "0"), ("model_name", "tiny"))

    def value(values: dict, name: str, **extra: str) -> float:
        return values.get((name, tuple(sorted((*labels, *extra.items())))), 0.0)

    before = _metrics(server.url)
    prompt_tokens = completion_tokens = 0
    for prompt, n in (("The shoal", 3), ("Every job batches the tokens", 7), (PROMPT, 12)):
        usage = client.completions.create(model="tiny", prompt=prompt, max_tokens=n,
                                          temperature=0).usage
        prompt_tokens += usage.prompt_tokens
        completion_tokens += usage.completion_tokens
    after = _metrics(server.url)

    def delta(name: str, **extra: str) -> float:
        return value(after, name, **extra) - value(before, name, **extra)

    assert delta("vllm:prompt_tokens_total") == prompt_tokens
    assert delta("vllm:generation_tokens_total") == completion_tokens
    assert delta("vllm:time_to_first_token_seconds_count") == 3
    assert delta("vllm:e2e_request_latency_seconds_count") == 3
    # one interval per token after each request's first
    assert delta("vllm:time_per_output_token_seconds_count") == completion_tokens - 3
    assert delta("vllm:request_success_total", finished_reason="length") \
        + delta("vllm:request_success_total", finished_reason="stop") == 3
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:num_requests_waiting") == 0
    assert value(after, "vllm:e2e_request_latency_seconds_bucket", le="7680.0") \
        == value(after, "vllm:e2e_request_latency_seconds_count")
    text = httpx.get(server.url + "/metrics").text
    for line in ("# TYPE vllm:num_requests_running gauge",
                 "# TYPE vllm:prompt_tokens_total counter",
                 "# TYPE vllm:time_to_first_token_seconds histogram",
                 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",'
                 'model_name="tiny"}',
                 'vllm:time_per_output_token_seconds_bucket{engine="0",le="0.075",'
                 'model_name="tiny"}',
                 "shoal_llm_generated_tokens_total"):  # beside shoal's own
        assert line in text, line


# --- embeddings ---------------------------------------------------------------------------

def _bert(directory: Path, source: Path, pooling: str | None) -> Path:
    """A tiny random BERT with the LLM's tokenizer; sentence-transformers' pooling config
    when *pooling* is given."""
    import torch
    from transformers import BertConfig, BertModel

    from shoal.llm import write_serving_properties

    directory.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, directory / name)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=400, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=MAX_POSITIONS)
    BertModel(config).save_pretrained(directory)
    if pooling is not None:
        (directory / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling",
             "type": "sentence_transformers.models.Pooling"}]))
        (directory / "1_Pooling").mkdir()
        (directory / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": 32, "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean"}))
    write_serving_properties(directory, {"engine": "Python", "option.dtype": "fp32"})
    return directory


@pytest.mark.parametrize("pooling", ["mean", None])
def test_embeddings_pool_as_the_model_config_says(tmp_path, model_dir, pooling):
    import torch
    from transformers import AutoModel, AutoTokenizer

    directory = _bert(tmp_path / "bert", model_dir, pooling)
    inputs = ["A reef answers", "The shoal swims past the tokens quickly"]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    want = []
    with torch.no_grad():
        for text in inputs:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            hidden = model(input_ids=ids).last_hidden_state[0]
            pooled = hidden.mean(0) if pooling == "mean" else hidden[0]  # no config: CLS
            want.append(torch.nn.functional.normalize(pooled, dim=-1).tolist())
    app = LlmServerApp(load_serving_options(directory, {}), ServerOptions(port=0))
    with ThreadServer(app) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        raw = client.embeddings.with_raw_response.create(model="bert", input=inputs)
        answer = raw.parse()  # the client asks for base64 and decodes it
        CreateEmbeddingResponse.model_validate(answer.model_dump())
        floats = httpx.post(s.url + "/v1/embeddings", json={
            "input": inputs, "encoding_format": "float"}).json()
        CreateEmbeddingResponse.model_validate(floats)
        with pytest.raises(openai.BadRequestError, match="embedding model"):
            client.completions.create(model="bert", prompt="A reef")
    assert answer.usage.prompt_tokens == sum(len(tokenizer(t)["input_ids"]) for t in inputs)
    for got, expected in zip(answer.data, want, strict=True):
        assert got.embedding == pytest.approx(expected, abs=1e-5)
    for raw_float, decoded in zip(floats["data"], answer.data, strict=True):
        assert raw_float["embedding"] == pytest.approx(decoded.embedding, abs=1e-6)
