"""LMI configurations served by real ``python -m shoal.serving`` processes on a CPU (issue #19):
the Llama 2 article's Transformers NeuronX ``serving.properties`` as written (a local tiny
model for its S3 model id) loads, says once which engine serves it and what runs otherwise
here, and answers; and streamed answers join to the whole answer for the same seed and
settings (LMI JSON lines, TGI SSE, and ``huggingface_hub``'s streaming client), the demo's
streamed question included."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_models import Reference, make_tiny_llm, running  # noqa: E402

ARTICLE = """engine=Python
option.entryPoint=djl_python.transformers_neuronx
option.model_id={model_id}
option.batch_size=4
option.neuron_optimize_level=2
option.tensor_parallel_degree=8
option.n_positions=512
option.rolling_batch=auto
option.dtype=fp16
option.model_loading_timeout=1500
"""


def test_the_articles_neuronx_configuration_serves_on_a_cpu(tmp_path):
    model = make_tiny_llm(tmp_path / "llama", max_positions=512)
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "serving.properties").write_text(ARTICLE.format(model_id=model))
    with running(deploy, tmp_path) as (url, log):
        prompt = "The shoal swims past"
        answer = httpx.post(f"{url}/invocations", timeout=60, json={
            "inputs": prompt, "parameters": {"max_new_tokens": 8, "do_sample": False}})
        assert answer.status_code == 200, answer.text
        # fp16 asked, float32 run on the CPU: the fp32 reference's answer
        assert answer.json() == {"generated_text": Reference(model).text(prompt, 8)}
        assert "shoal_model_loaded 1.0" in httpx.get(f"{url}/metrics").text
    said = log.read_text()  # stdout and stderr
    # read from the file: logged once, and once in the startup lines on stdout
    for words in ("served by shoal's transformers engine, continuous batching of up to 4 "
                  "sequences; in DJL: Transformers NeuronX",
                  "kept with no effect here: option.neuron_optimize_level=2"):
        assert said.count(words) == 2, (words, said)
    banner = f"\n  {(deploy / 'serving.properties').resolve()} (engine=Python, option.entryPoint="
    assert banner in said, said
    # found while loading: logged once
    for words in ("option.tensor_parallel_degree=8 (for Transformers NeuronX the degree counts "
                  "NeuronCores): this machine has no GPU",
                  "option.dtype=fp16: this machine has no GPU; the model runs in float32"):
        assert said.count(words) == 1, (words, said)


def test_strict_mode_refuses_the_article_on_a_cpu(tmp_path):
    import subprocess

    from llm_models import SERVER, SERVER_ENV

    model = make_tiny_llm(tmp_path / "llama", max_positions=512)
    (tmp_path / "serving.properties").write_text(ARTICLE.format(model_id=model))
    proc = subprocess.run([*SERVER, "--model", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, **SERVER_ENV, "OPTION_SHOAL_STRICT": "true"})
    assert proc.returncode != 0
    assert "option.shoal_strict=true" in proc.stderr
    assert "option.neuron_optimize_level" in proc.stderr


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llm(tmp_path_factory.mktemp("llm") / "model")


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running(model_dir, tmp_path_factory.mktemp("server")) as (url, _):
        yield url


def _lines(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{url}/invocations", json={**body, "stream": True},
                      timeout=60) as r:
        assert r.headers["content-type"].startswith("application/jsonlines")
        return [json.loads(line) for line in r.iter_lines() if line]


@pytest.mark.parametrize("parameters", [
    {"max_new_tokens": 12, "do_sample": False},
    {"max_new_tokens": 12, "do_sample": True, "temperature": 1.5, "seed": 7},
])
def test_streamed_tokens_join_to_the_whole_answer(server, model_dir, parameters, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    reference = Reference(model_dir)
    chat = reference.chat_prompt([{"role": "user", "content": "A reef answers"}])
    for prompt in ("Every job batches", chat):
        body = {"inputs": prompt, "parameters": parameters}
        whole = httpx.post(f"{server}/invocations", json=body, timeout=60).json()
        lines = _lines(server, body)
        assert len(lines) > 1 and whole["generated_text"]
        assert "".join(e["token"]["text"] for e in lines) == whole["generated_text"]
        assert lines[-1]["generated_text"] == whole["generated_text"]
        if not parameters["do_sample"]:
            assert whole["generated_text"] == reference.text(prompt, 12)
    # huggingface_hub's streaming client (TGI's /generate_stream), the same settings
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)  # read at import; local URL
    client = hub.InferenceClient(base_url=server)
    tgi = {k: v for k, v in parameters.items() if k != "do_sample"}
    tgi["do_sample"] = parameters["do_sample"]
    whole = client.text_generation("Every job batches", **tgi)
    assert "".join(client.text_generation("Every job batches", stream=True, **tgi)) == whole


def test_the_demo_streams_the_question_it_asked_and_it_joins(model_dir, capsys):
    from shoal.cli._demo_llm_serving import run_llm_serving_demo

    run_llm_serving_demo(model_dir, "A reef answers", 15)
    out = capsys.readouterr().out
    streamed = next(line for line in out.splitlines() if "POST /invocations" in line)
    assert "JSON lines, joined:" in streamed and " 1 JSON lines" not in streamed
    assert "(the same as without streaming)" in out
