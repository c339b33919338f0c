"""``option.quantize`` (issue #8): bitsandbytes 0.50.2 runs both NF4 (4-bit) and LLM.int8
(8-bit) on CPU, so a tiny Llama is served quantized by a real server process, and its greedy
answer equals transformers' ``generate()`` on the same model loaded with the same
quantization."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

from helpers import wait_until  # noqa: E402
from llm_models import make_tiny_llm  # noqa: E402

PROMPT = "The shoal swims past"
N = 8


@contextmanager
def llm_server(model_dir: Path, tmp_path: Path) -> Iterator[str]:
    """``python -m shoal.serving`` on 127.0.0.1, a free port; yields its URL once /ping is 200."""
    port_file = tmp_path / "port"
    log = tmp_path / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "shoal.serving", "--model", str(model_dir),
                                 "--host", "127.0.0.1", "--port", "0", "--port-file",
                                 str(port_file)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    try:
        def up() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"the server exited with {proc.returncode}: "
                                     f"{log.read_text()}")
            if not port_file.exists():
                return None
            url = f"http://127.0.0.1:{port_file.read_text().strip()}"
            return url if httpx.get(f"{url}/ping", timeout=5).status_code == 200 else None

        url = wait_until(up, 90, what="the quantized LLM server answers /ping")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()


def _quantized_reference(model_dir: Path, bits: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    config = (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4") if bits == 4
              else BitsAndBytesConfig(load_in_8bit=True))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with warnings.catch_warnings():  # int8 on CPU: "inputs will be cast to float16"
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=config,
                                                     dtype=torch.float32).eval()
        ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=N, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
    return str(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))


@pytest.mark.parametrize(("value", "bits"), [("bitsandbytes4", 4), ("bitsandbytes", 8)])
def test_a_quantized_model_is_served_on_cpu(tmp_path, value, bits):
    model_dir = make_tiny_llm(tmp_path / "model", option_quantize=value)
    with llm_server(model_dir, tmp_path) as url:
        answer = httpx.post(f"{url}/invocations", timeout=60, json={
            "inputs": PROMPT, "parameters": {"max_new_tokens": N, "do_sample": False}})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"generated_text": _quantized_reference(model_dir, bits)}
    log = (tmp_path / "server.log").read_text()
    # 2 layers x 7 projections are bitsandbytes layers (lm_head stays full precision)
    assert f"float32, bitsandbytes{bits}: 14 layers)" in log, log
