"""``shoal demo``, LLM serving: the model the fine-tuning section just merged, served by
``python -m shoal.serving`` (it finds ``serving.properties``) and asked through the ``openai``
client (``/v1/chat/completions``) and DJL's LMI schema (``/invocations``, streamed)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from shoal.cli._context import out

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionUserMessageParam

__all__ = ["run_llm_serving_demo"]


def run_llm_serving_demo(model_dir: Path, question: str, number: int) -> None:
    import httpx

    out().print()
    out().print(Text(f"{number}. serve the fine-tuned model: OpenAI- and LMI-compatible "
                     "endpoints with continuous batching", style="bold cyan"))
    started = time.monotonic()
    port_file = model_dir.parent / "llm.port"
    from shoal.config import child_environ

    env = child_environ(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "shoal.serving", "--model", str(model_dir),
                             "--port", "0", "--port-file", str(port_file), "--log-level",
                             "WARNING"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        url = _wait_ready(proc, port_file)
        out().print(Text(f"   python -m shoal.serving --model {model_dir.name}/  ->  {url} "
                         f"(serving.properties found: the LLM server)", style="dim"))
        messages = [{"role": "user", "content": question}]
        try:
            from openai import OpenAI
        except ImportError:
            answer = httpx.post(url + "/v1/chat/completions", json={
                "messages": messages, "max_tokens": 24, "temperature": 0}, timeout=60).json()
            chat = answer["choices"][0]["message"]["content"]
            how = "POST /v1/chat/completions (pip install openai to use its client)"
        else:
            client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            name = client.models.list().data[0].id  # the served name: the directory's
            chat_messages: list[ChatCompletionUserMessageParam] = [
                {"role": "user", "content": question}]  # messages, as openai's type says
            reply = client.chat.completions.create(model=name, messages=chat_messages,
                                                   max_tokens=24, temperature=0)
            chat = reply.choices[0].message.content or ""
            how = "openai.OpenAI(base_url=.../v1).chat.completions.create"
        out().print(Text(f"   {how}:"))
        out().print(Text(f"     {chat!r}", style="green"))
        _stream_the_same_question(url, model_dir, messages)
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
    out().print(Text(f"   {time.monotonic() - started:.1f}s. The same directory deploys with "
                     f"Model(model_data=...).deploy() or 'shoal serve DIR'", style="dim"))


def _stream_the_same_question(url: str, model_dir: Path, messages: list[dict[str, str]]) -> None:
    """The question again through LMI's ``/invocations``, whole and streamed with the same
    greedy settings: the streamed tokens join to the whole answer. The prompt is the
    question in the chat template the model was fine-tuned on; a plain-text prompt is
    outside what it learnt, and its first greedy token can be the end of text (a stream of
    one line with empty text, as an early version of this demo showed)."""
    import httpx
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 24, "do_sample": False}}
    whole = httpx.post(url + "/invocations", json=body, timeout=60).json()["generated_text"]
    pieces: list[str] = []
    with httpx.stream("POST", url + "/invocations", json={**body, "stream": True},
                      timeout=60) as r:
        for line in r.iter_lines():
            if line:
                pieces.append(json.loads(line)["token"]["text"])
    joined = "".join(pieces)
    out().print(Text(f"   POST /invocations {{\"inputs\": <the question in the chat template>, "
                     f"\"stream\": true}} -> {len(pieces)} JSON lines, joined:"))
    same = ("the same as without streaming" if joined == whole
            else f"NOT the answer without streaming, {whole!r}")
    out().print(Text(f"     {joined!r}", style="green" if joined == whole else "red"),
                Text(f"({same})", style="dim"))


def _wait_ready(proc: subprocess.Popen[bytes], port_file: Path) -> str:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"the LLM server exited with status {proc.returncode}: "
                               f"{err.strip()[-2000:]}")
        if port_file.exists() and port_file.read_text().strip():
            url = f"http://127.0.0.1:{port_file.read_text().strip()}"
            try:
                if httpx.get(url + "/ping", timeout=5).status_code == 200:
                    return url
            except httpx.TransportError:
                pass
        time.sleep(0.1)
    raise RuntimeError("the LLM server did not answer /ping within 60 s")
