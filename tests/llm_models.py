"""A tiny LLM the serving tests share: a random-init Llama (hidden 64, 2 layers) with a BPE
tokenizer trained on local text and a chat template, written by ``shoal.llm``'s
``create_tiny_model`` beside a ``serving.properties``; the reference answers, from
transformers' own ``generate()`` on the same weights; and ``running``, a real
``python -m shoal.serving`` process for a model directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}")

TEXTS = [f"{a} {b} {c}." for a in ("The shoal", "A reef", "Every job", "The server")
         for b in ("swims past", "answers", "batches", "streams")
         for c in ("the tokens", "a request", "quickly", "in order", "the ping")]

#: Small enough to exceed in a test; large enough for the prompts used.
MAX_POSITIONS = 128


def make_tiny_llm(directory: Path, *, max_positions: int = MAX_POSITIONS,
                  chat_template: str = CHAT_TEMPLATE,
                  **properties: object) -> Path:
    """The model and tokenizer, and a serving.properties with *properties* (``option.``
    keys given with dots replaced: ``option_dtype="fp32"``)."""
    from shoal.llm import create_tiny_model, write_serving_properties

    create_tiny_model(directory, TEXTS * 3, vocab_size=400, hidden_size=64, num_layers=2,
                      max_positions=max_positions, chat_template=chat_template)
    props: dict[str, object] = {"engine": "Python", "option.dtype": "fp32"}
    props.update({k.replace("option_", "option.", 1): v for k, v in properties.items()})
    write_serving_properties(directory, props)
    return directory


class Reference:
    """Solo ``generate()`` answers from the model in *directory* (greedy)."""

    def __init__(self, directory: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.model = AutoModelForCausalLM.from_pretrained(directory).eval()

    def ids(self, prompt: str, *, chat: bool = False) -> list[int]:
        return list(self.tokenizer(prompt, add_special_tokens=not chat)["input_ids"])

    def generate_ids(self, prompt: str, max_new_tokens: int, *, chat: bool = False) -> list[int]:
        import torch

        ids = torch.tensor([self.ids(prompt, chat=chat)])
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id)
        return out[0, ids.shape[1]:].tolist()

    def text(self, prompt: str, max_new_tokens: int, *, chat: bool = False) -> str:
        return str(self.tokenizer.decode(self.generate_ids(prompt, max_new_tokens, chat=chat),
                                         skip_special_tokens=True))

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True))


SERVER = [sys.executable, "-m", "shoal.serving", "--host", "127.0.0.1", "--port", "0"]
SERVER_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@contextmanager
def running(model_dir: Path, tmp_path: Path, env: dict[str, str] | None = None
            ) -> Iterator[tuple[str, Path]]:
    """``python -m shoal.serving --model DIR`` on a free port; yields its URL (once /ping is
    200) and its output (stdout and stderr); stops it with SIGTERM and checks it exited
    cleanly."""
    import httpx

    from helpers import wait_until

    port_file = tmp_path / "port"
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*SERVER, "--model", str(model_dir), "--port-file",
                                 str(port_file)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                env={**os.environ, **SERVER_ENV, **(env or {})})
    try:
        def up() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"the server exited ({proc.returncode}): {log.read_text()}")
            if not port_file.exists():
                return None
            url = f"http://127.0.0.1:{port_file.read_text().strip()}"
            return url if httpx.get(f"{url}/ping", timeout=5).status_code == 200 else None

        yield wait_until(up, 90, what="the LLM server answers /ping"), log
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()


class ThreadServer:
    """*app* (an ASGI app with a model to load) under uvicorn on 127.0.0.1, port 0, on a
    thread; entering waits until ``/ping`` answers 200."""

    def __init__(self, app: Any) -> None:
        import threading

        import uvicorn

        from shoal.serving.runner import bind

        self.app = app
        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_config=None,
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> ThreadServer:
        import httpx

        from helpers import wait_until

        self.thread.start()
        wait_until(lambda: httpx.get(self.url + "/ping").status_code == 200, 60,
                   what="the LLM server to load")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
