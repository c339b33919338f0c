"""The LLM server (issue #8) on a tiny random-init Llama, over real HTTP (uvicorn on a thread):
greedy output through every API equals transformers' ``generate()``; streams concatenate to
the whole text; stop sequences end and are trimmed; the openai and huggingface_hub clients
work unchanged; requests joining a decoding batch finish as they would alone; bad requests
get a clear error each while the server stays up."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers import wait_until  # noqa: E402
from llm_models import MAX_POSITIONS, Reference, ThreadServer, make_tiny_llm  # noqa: E402
from shoal.llm.serving import GenerationParams, LlmServerApp, load_serving_options  # noqa: E402
from shoal.llm.serving._engine_process import EngineProcess  # noqa: E402
from shoal.serving import ServerOptions  # noqa: E402

PROMPTS = ["The shoal swims past", "A reef", "Every job batches the tokens in order. The server"]
N = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llm(tmp_path_factory.mktemp("llm") / "model",
                         option_max_rolling_batch_size=8, job_queue_size=4)


@pytest.fixture(scope="module")
def ref(model_dir: Path) -> Reference:
    return Reference(model_dir)


@pytest.fixture(scope="module", params=["engine thread", "engine process"])
def server(model_dir: Path, request: pytest.FixtureRequest) -> Iterator[ThreadServer]:
    """The server with its engine on a thread of its own, and in a process of its own
    (``option.shoal_engine_process``): every test of it runs against both."""
    process = "true" if request.param == "engine process" else "false"
    app = LlmServerApp(load_serving_options(model_dir, {"OPTION_SHOAL_ENGINE_PROCESS": process}),
                       ServerOptions(port=0))
    with ThreadServer(app) as s:
        assert isinstance(s.app.loaded.engine, EngineProcess) == (process == "true")
        yield s


def _sse(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def test_greedy_output_through_every_api_equals_generate(server, ref):
    url = server.url
    for prompt in PROMPTS:
        want = ref.text(prompt, N)
        lmi = httpx.post(url + "/invocations", json={
            "inputs": prompt, "parameters": {"max_new_tokens": N, "do_sample": "False"}})
        assert lmi.status_code == 200 and lmi.json() == {"generated_text": want}, lmi.text
        tgi = httpx.post(url + "/generate", json={
            "inputs": prompt, "parameters": {"max_new_tokens": N, "details": True}}).json()
        assert tgi["generated_text"] == want
        assert tgi["details"]["generated_tokens"] == len(ref.generate_ids(prompt, N))
        assert [t["id"] for t in tgi["details"]["tokens"]] == ref.generate_ids(prompt, N)
        oai = httpx.post(url + "/v1/completions", json={
            "model": "model", "prompt": prompt, "max_tokens": N, "temperature": 0}).json()
        assert oai["choices"][0]["text"] == want
        assert oai["usage"] == {"prompt_tokens": len(ref.ids(prompt)),
                                "completion_tokens": len(ref.generate_ids(prompt, N)),
                                "total_tokens": len(ref.ids(prompt))
                                + len(ref.generate_ids(prompt, N))}

    # streams: JSON lines (LMI), SSE (TGI), SSE ending [DONE] (OpenAI); pieces join to the text
    prompt = PROMPTS[2]
    want = ref.text(prompt, N)
    lines = httpx.post(url + "/invocations", json={
        "inputs": prompt, "parameters": {"max_new_tokens": N}, "stream": True})
    assert lines.headers["content-type"].startswith("application/jsonlines")
    events = [json.loads(line) for line in lines.text.splitlines()]
    assert "".join(e["token"]["text"] for e in events) == want
    assert events[-1]["generated_text"] == want and events[0]["generated_text"] is None
    tgi = [json.loads(d) for d in _sse(httpx.post(url + "/generate_stream", json={
        "inputs": prompt, "parameters": {"max_new_tokens": N}}).text)]
    assert "".join(e["token"]["text"] for e in tgi) == want == tgi[-1]["generated_text"]
    raw = httpx.post(url + "/v1/completions", json={
        "prompt": prompt, "max_tokens": N, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}}).text
    data = _sse(raw)
    assert data[-1] == "[DONE]" and raw.endswith("data: [DONE]\n\n")
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == want
    assert chunks[-1]["usage"]["completion_tokens"] == len(ref.generate_ids(prompt, N))

    # chat: the tokenizer's chat template, then the same greedy answer
    messages = [{"role": "user", "content": "Every job batches"}]
    chat_want = ref.text(ref.chat_prompt(messages), N, chat=True)
    chat = httpx.post(url + "/v1/chat/completions", json={
        "model": "model", "messages": messages, "max_tokens": N, "temperature": 0}).json()
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": chat_want}
    assert chat["object"] == "chat.completion"
    models = httpx.get(url + "/v1/models").json()
    assert models["data"][0]["max_model_len"] == MAX_POSITIONS


def test_the_openai_and_huggingface_clients_work_unchanged(server, ref, monkeypatch):
    openai = pytest.importorskip("openai")
    hub = pytest.importorskip("huggingface_hub")
    # HF_HUB_OFFLINE (read once, at import) blocks every request, even to this local server
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    prompt, want = PROMPTS[0], ref.text(PROMPTS[0], N)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert client.models.list().data[0].id == "model"
    done = client.completions.create(model="model", prompt=prompt, max_tokens=N, temperature=0)
    assert done.choices[0].text == want and done.usage.completion_tokens > 0
    messages = [{"role": "user", "content": "A reef answers"}]
    chat_want = ref.text(ref.chat_prompt(messages), N, chat=True)
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="model", messages=messages, max_tokens=N, temperature=0, stream=True)
        if c.choices]
    assert "".join(pieces) == chat_want
    with pytest.raises(openai.BadRequestError, match="limit of 128 tokens"):
        client.completions.create(model="model", prompt=prompt, max_tokens=10_000)

    hf = hub.InferenceClient(base_url=server.url)
    assert hf.text_generation(prompt, max_new_tokens=N) == want
    assert "".join(hf.text_generation(prompt, max_new_tokens=N, stream=True)) == want
    detailed = hf.text_generation(prompt, max_new_tokens=N, details=True)
    assert detailed.generated_text == want and detailed.details.finish_reason in (
        "length", "eos_token")
    # the model named as served (huggingface_hub sends "dummy" when it has none: 404, as vLLM)
    answer = hf.chat_completion(messages, model="model", max_tokens=N, temperature=0)
    assert answer.choices[0].message.content == chat_want


def test_stop_sequences_end_generation_and_are_trimmed(server, ref):
    prompt = PROMPTS[1]
    full = ref.text(prompt, 24)
    stop = next(full[i:i + 3] for i in range(6, len(full) - 3)
                if full.find(full[i:i + 3]) == i and full[i:i + 3].strip())
    want = full[:full.find(stop)]
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 24, "stop": [stop],
                                             "details": True}}
    answer = httpx.post(server.url + "/generate", json=body).json()
    assert answer["generated_text"] == want
    assert answer["details"]["finish_reason"] == "stop_sequence"
    streamed = [json.loads(d) for d in _sse(httpx.post(server.url + "/generate_stream",
                                                       json=body).text)]
    assert "".join(e["token"]["text"] for e in streamed) == want
    oai = httpx.post(server.url + "/v1/completions", json={
        "prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": stop}).json()
    assert oai["choices"][0] == {"index": 0, "text": want, "finish_reason": "stop",
                                 "logprobs": None}


def test_requests_joining_a_decoding_batch_finish_as_they_would_alone(server, ref):
    """The second to fourth requests are submitted from the first one's third token, so they
    join a batch that is decoding; each answer equals its solo generate()."""
    engine = server.app.loaded.engine
    lengths = {0: 30, 1: 8, 2: 16, 3: 24}
    prompts = {0: PROMPTS[2], 1: PROMPTS[0], 2: PROMPTS[1], 3: "The server streams quickly"}
    got: dict[int, list[int]] = {i: [] for i in prompts}
    first_token_while_first_decodes: list[bool] = []
    finished = threading.Event()
    done: dict[int, bool] = {}

    def collect(i: int):
        def on_event(event) -> None:
            got[i].append(event.token_id)
            if i == 0 and len(got[0]) == 3:
                for j in (1, 2, 3):
                    engine.submit(ref.ids(prompts[j]),
                                  GenerationParams(max_new_tokens=lengths[j]), collect(j))
            if i != 0 and len(got[i]) == 1:
                first_token_while_first_decodes.append(len(got[0]) < lengths[0])
            if event.finish is not None:
                done[i] = True
                if len(done) == 4:
                    finished.set()
        return on_event

    engine.submit(ref.ids(prompts[0]), GenerationParams(max_new_tokens=lengths[0]), collect(0))
    assert finished.wait(60)
    for i, prompt in prompts.items():
        assert got[i] == ref.generate_ids(prompt, lengths[i]), i
    assert first_token_while_first_decodes == [True, True, True]
    wait_until(lambda: engine.live == 0, 5)
    if not isinstance(engine, EngineProcess):
        assert engine._cache is None  # every row left, so the cache is gone


def test_bad_requests_get_a_clear_error_and_the_server_stays_up(server):
    url = server.url
    long_prompt = " ".join(["The shoal swims past the tokens."] * 40)
    r = httpx.post(url + "/generate", json={"inputs": long_prompt})
    assert r.status_code == 422 and "at most 128 tokens" in r.json()["error"], r.text
    for bad, words in ((0, ">= 1"), (10**9, "limit of 128"), ("x", "integer")):
        r = httpx.post(url + "/invocations", json={"inputs": "A reef",
                                                   "parameters": {"max_new_tokens": bad}})
        assert r.status_code == 422 and words in r.json()["error"], r.text
    r = httpx.post(url + "/invocations", json={"inputs": "A reef",
                                               "parameters": {"frobnicate": 1, "top_k": 2}})
    assert r.status_code == 422 and "['frobnicate']" in r.json()["error"]
    r = httpx.post(url + "/invocations", content=b'{"inputs": "A reef",',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]
    r = httpx.post(url + "/v1/chat/completions", json={"messages": "hi"})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    assert httpx.get(url + "/v1/nothing").status_code == 404
    assert httpx.get(url + "/ping").status_code == 200


def test_a_full_queue_answers_503_with_retry_after_then_drains(server, ref):
    engine = server.app.loaded.engine
    body = {"inputs": "A reef", "parameters": {"max_new_tokens": 4}}

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            engine.pause()
            try:
                waiting = [asyncio.create_task(client.post("/generate", json=body))
                           for _ in range(engine.max_queue)]
                await asyncio.to_thread(wait_until, lambda: engine.queue_depth == 4, 10)
                refused = await client.post("/generate", json=body)
            finally:
                engine.resume()
            return [refused, *await asyncio.gather(*waiting)]

    refused, *served = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "job_queue_size=4" in refused.json()["error"]
    assert [r.status_code for r in served] == [200] * 4
    assert {r.json()["generated_text"] for r in served} == {ref.text("A reef", 4)}


def test_a_client_that_disconnects_frees_its_slot(server):
    engine = server.app.loaded.engine
    with httpx.Client(base_url=server.url) as client, client.stream(
            "POST", "/generate_stream",
            json={"inputs": "A reef", "parameters": {"max_new_tokens": 100}}) as r:
        for _ in r.iter_lines():
            if engine.live:
                break
    wait_until(lambda: engine.live == 0 and engine.queue_depth == 0, 10,
               what="the cancelled generation to leave the batch")
    # and the request's task ended (a cancelled generation sends no last event): counted 499
    wait_until(lambda: 'route="/generate_stream",status="499"' in httpx.get(
        server.url + "/metrics").text, 10, what="the abandoned request to end as 499")


def test_metrics_report_tokens_ttft_occupancy_and_queue(server):
    httpx.post(server.url + "/generate", json={"inputs": "A reef",
                                               "parameters": {"max_new_tokens": 3}})
    text = httpx.get(server.url + "/metrics").text
    for series in ("shoal_llm_generated_tokens_total", "shoal_llm_tokens_per_second",
                   "shoal_llm_time_to_first_token_seconds_count", "shoal_llm_batch_occupancy",
                   "shoal_llm_queue_depth", 'shoal_llm_requests_total{route="/generate",'
                   'status="200"}', "shoal_model_loaded 1.0"):
        assert series in text, series


def test_tgi_compat_answers_invocations_as_tgis_container(model_dir, ref):
    # What HuggingFaceModel's variables ask for: TGI's shapes on SageMaker's route.
    env = {"OPTION_TGI_COMPAT": "true", "OPTION_RETURN_FULL_TEXT": "true"}
    app = LlmServerApp(load_serving_options(model_dir, env), ServerOptions(port=0))
    prompt, n = PROMPTS[0], 6
    want = ref.text(prompt, n)
    with ThreadServer(app) as s:
        r = httpx.post(s.url + "/invocations", json={
            "inputs": prompt, "parameters": {"max_new_tokens": n}})
        assert r.status_code == 200 and r.json() == [{"generated_text": prompt + want}], r.text
        (answer,) = httpx.post(s.url + "/invocations", json={
            "inputs": prompt, "parameters": {"max_new_tokens": n, "details": True,
                                             "return_full_text": False}}).json()
        assert answer["generated_text"] == want
        details = answer["details"]
        assert [t["id"] for t in details["tokens"]] == ref.generate_ids(prompt, n)
        assert {"finish_reason", "generated_tokens", "seed", "prefill"} <= set(details)
        assert "logprob" in details["tokens"][0]  # TGI's key; LMI's is log_prob
        # stream: TGI's SSE events, the last one carrying the whole text
        r = httpx.post(s.url + "/invocations", json={
            "inputs": prompt, "parameters": {"max_new_tokens": n}, "stream": True})
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(d) for d in _sse(r.text)]
        assert "".join(e["token"]["text"] for e in events) == want
        assert events[-1]["generated_text"] == prompt + want
        # TGI takes one prompt; a list is refused, saying so
        r = httpx.post(s.url + "/invocations", json={"inputs": [prompt, prompt]})
        assert r.status_code == 422 and "one prompt" in r.json()["error"], r.text
        # TGI's /generate keeps its own default (no prompt) and shape (an object)
        r = httpx.post(s.url + "/generate", json={
            "inputs": prompt, "parameters": {"max_new_tokens": n}})
        assert r.json() == {"generated_text": want}


class _StepLog:
    """Wraps an engine's observer and records its prefill calls (rows each), decode steps
    (live rows each) and first tokens, in order; ``on_prefill`` runs before each prefill's
    forward call (on the engine's thread)."""

    def __init__(self, inner: Any, on_prefill: Any = None) -> None:
        self.inner = inner
        self.on_prefill = on_prefill
        self.log: list[tuple[str, int]] = []
        self._prefilling = False

    def prefilled(self, prompt_tokens: int) -> None:
        self._prefilling = True
        self.inner.prefilled(prompt_tokens)
        if self.on_prefill is not None:
            self.on_prefill(len([e for e in self.log if e[0] == "prefill"]))

    def step(self, live: int, tokens: int, seconds: float) -> None:
        self.log.append(("prefill", tokens) if self._prefilling else ("decode", live))
        self._prefilling = False
        self.inner.step(live, tokens, seconds)

    def first_token(self, seconds: float) -> None:
        self.log.append(("first_token", 1))
        self.inner.first_token(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model whose batch and queue take 16 requests and more."""
    return make_tiny_llm(tmp_path_factory.mktemp("llm-wide") / "model",
                         option_max_rolling_batch_size=32, job_queue_size=32)


@pytest.fixture(scope="module")
def wide_server(wide_dir: Path) -> Iterator[ThreadServer]:
    # these tests read the engine's steps on its thread: the engine runs in this process
    app = LlmServerApp(load_serving_options(wide_dir, {"OPTION_SHOAL_ENGINE_PROCESS": "false"}),
                       ServerOptions(port=0))
    with ThreadServer(app) as s:
        yield s


def test_sixteen_concurrent_requests_get_their_first_tokens_from_one_prefill(wide_server):
    """16 streams sent at once (held in the queue until all are there) are prefilled in one
    forward call, and every one has its first token before the first decode step."""
    engine = wide_server.app.loaded.engine
    steps = _StepLog(engine.observer)
    engine.observer = steps
    prompt = PROMPTS[2]  # ~10 tokens: 16 of them are more than the old 96-token groups
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 6}}

    async def burst() -> list[str]:
        async with httpx.AsyncClient(base_url=wide_server.url, timeout=60) as client:
            async def one() -> str:
                r = await client.post("/generate_stream", json=body)
                return "".join(json.loads(e)["token"]["text"] for e in _sse(r.text))

            engine.pause()
            try:
                tasks = [asyncio.create_task(one()) for _ in range(16)]
                await asyncio.to_thread(wait_until, lambda: engine.queue_depth == 16, 30,
                                        what="the 16 requests to queue")
            finally:
                engine.resume()
            return list(await asyncio.gather(*tasks))

    try:
        texts = asyncio.run(burst())
    finally:
        engine.observer = steps.inner
    assert len(set(texts)) == 1 and texts[0]  # greedy: the same answer for the same prompt
    first_decode = next(i for i, e in enumerate(steps.log) if e[0] == "decode")
    before = steps.log[:first_decode]
    assert [e for e in before if e[0] == "prefill"] == [("prefill", 16)], steps.log
    assert before.count(("first_token", 1)) == 16, steps.log
    assert steps.log[first_decode] == ("decode", 16)


def test_requests_arriving_during_a_prefill_are_prefilled_before_the_next_decode_step(
        wide_server, wide_dir):
    """15 requests submitted while a lone request is being prefilled get their own prefill
    before any decode step (prefill before decode), and every answer equals its solo
    generate()."""
    engine = wide_server.app.loaded.engine
    ref = Reference(wide_dir)
    prompts = [PROMPTS[k % len(PROMPTS)] for k in range(16)]
    got: dict[int, list[int]] = {k: [] for k in range(16)}
    finished = threading.Event()
    done: set[int] = set()

    def collect(k: int) -> Any:
        def on_event(event: Any) -> None:
            got[k].append(event.token_id)
            if event.finish is not None:
                done.add(k)
                if len(done) == 16:
                    finished.set()
        return on_event

    def submit(k: int) -> None:
        engine.submit(ref.ids(prompts[k]), GenerationParams(max_new_tokens=5), collect(k))

    def on_prefill(earlier: int) -> None:
        if earlier == 0:  # the lone request's prefill: the burst arrives meanwhile
            for k in range(1, 16):
                submit(k)

    steps = _StepLog(engine.observer, on_prefill)
    engine.observer = steps
    try:
        submit(0)
        assert finished.wait(60)
    finally:
        engine.observer = steps.inner
    prefills = [e for e in steps.log if e[0] != "first_token"]
    assert prefills[:3] == [("prefill", 1), ("prefill", 15), ("decode", 16)], steps.log
    for k, prompt in enumerate(prompts):
        assert got[k] == ref.generate_ids(prompt, 5), k


def test_ordinary_tokens_are_handed_on_together_a_first_and_last_at_once(
        server, ref):
    """``on_step`` (the server's one event-loop wake-up) comes at once after a request's
    first token and after its last, and in between at most every ``stream_interval_s``: with
    the interval longer than the test, one call carries the first token and one the rest; at
    interval 0, one call per step. Events held back are handed on before the engine waits
    (here: paused mid-generation). The tokens are those of solo generate() either way."""
    engine = server.app.loaded.engine
    if isinstance(engine, EngineProcess):
        pytest.skip("the hand-over on the engine's thread: the engine process's own thread "
                    "does it (this test runs it on the [engine thread] server)")
    original = engine.on_step
    prompt = PROMPTS[0]
    expected = ref.generate_ids(prompt, 6)
    n = len(expected)  # 6, or fewer where greedy reaches EOS
    assert n >= 4, expected

    def run(interval: float, pause_after: int | None = None) -> tuple[list[int], list[int]]:
        events: list[Any] = []
        handed: list[int] = []  # events emitted so far, at each on_step
        finished = threading.Event()

        def on_event(event: Any) -> None:
            events.append(event)
            if pause_after is not None and len(events) == pause_after:
                engine.pause()  # on the engine's thread: it waits after this iteration

        def on_step() -> None:
            handed.append(len(events))
            if events and (events[-1].finish is not None or events[-1].error is not None):
                finished.set()  # the last event was handed on
            if original is not None:
                original()

        engine.stream_interval_s, engine.on_step = interval, on_step
        try:
            engine.submit(ref.ids(prompt), GenerationParams(max_new_tokens=6), on_event)
            if pause_after is not None:
                wait_until(lambda: len(events) == pause_after and engine._idle, 30,
                           what="the paused engine to wait")
                # nothing is held while it waits: every event emitted so far was handed on
                assert handed and handed[-1] == len(events) == pause_after, handed
                assert not finished.is_set()
                engine.resume()
            assert finished.wait(60)
        finally:
            engine.on_step = original
            del engine.stream_interval_s  # back to the class's default
        assert [e.token_id for e in events] == expected
        return [e.token_id for e in events], handed

    _, handed = run(3600.0)
    assert handed == [1, n]  # the first token at once, then the rest with the last
    _, handed = run(0.0)
    assert handed == list(range(1, n + 1))  # every step
    _, handed = run(3600.0, pause_after=3)
    assert handed == [1, 3, n]  # held tokens 2-3 went out before the engine waited


# --- the engine in a process of its own (option.shoal_engine_process) ---------------------------


def test_a_killed_engine_process_fails_its_requests_and_the_server_says_why(model_dir, ref):
    """SIGKILL the engine process mid-stream: the open stream ends with an error line naming
    its exit status, a new request is refused 503, and /ping answers 503 with the reason
    (under ``python -m shoal.serving`` the failure also stops the server)."""
    import signal

    app = LlmServerApp(load_serving_options(model_dir, {"OPTION_SHOAL_ENGINE_PROCESS": "true"}),
                       ServerOptions(port=0))
    with ThreadServer(app) as s:
        engine = app.loaded.engine
        assert isinstance(engine, EngineProcess)
        pid = engine._proc.pid
        lines: list[dict[str, Any]] = []
        with httpx.Client(base_url=s.url, timeout=30) as client, client.stream(
                "POST", "/invocations",
                json={"inputs": "A reef", "parameters": {"max_new_tokens": 100},
                      "stream": True}) as r:
            for line in r.iter_lines():
                lines.append(json.loads(line))
                if len(lines) == 2:
                    os.kill(pid, signal.SIGKILL)
        assert lines[-1]["error"] == "the engine process exited with status -9; restart the " \
                                     "server", lines[-1]
        wait_until(lambda: httpx.get(s.url + "/ping").status_code == 503, 10,
                   what="/ping to say the model is gone")
        ping = httpx.get(s.url + "/ping").json()
        assert "engine process exited with status -9" in ping["error"], ping
        refused = httpx.post(s.url + "/generate", json={"inputs": "A reef"})
        assert refused.status_code == 503, refused.text
        assert engine._proc.poll() == -9


def test_an_engine_process_that_cannot_load_the_weights_fails_the_load_naming_them(
        model_dir, tmp_path):
    """Weights the engine process cannot read: the load fails with its ModelLoadError (the
    path named), and no engine process is left running."""
    import shutil

    from shoal.errors import ModelLoadError
    from shoal.llm.serving._engine import EngineObserver
    from shoal.llm.serving._loading import load_model

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    spawned: list[EngineProcess] = []
    original = EngineProcess.spawn

    def spawn(self: EngineProcess, *args: Any, **kwargs: Any) -> None:
        spawned.append(self)
        original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EngineProcess, "spawn", spawn)
        with pytest.raises(ModelLoadError, match="cannot load the model from") as caught:
            load_model(load_serving_options(broken, {"OPTION_SHOAL_ENGINE_PROCESS": "true"}),
                       EngineObserver())
    assert str(broken) in str(caught.value)
    (process,) = spawned
    assert process._proc is not None and process._proc.poll() is not None
