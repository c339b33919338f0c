"""``shoal demo``, LLM fine-tuning: LoRA on a tiny Llama with shoal's own instruction set, as
a ``FineTuner`` job inside an experiment run; the loss per step from the run, then a
generation from the merged model in ``model_data``.

No weights can be downloaded, so the base is a random-init Llama with a tokenizer trained on
the instruction set: what it learns in a minute is the set's shape, not much sense.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from importlib.resources import as_file, files
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from shoal._internal.archives import extract_tar
from shoal.cli._context import out, state

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["run_llm_demo"]

_QUESTION = "What is 2 plus 3?"


def run_llm_demo(session: Session, number: int) -> None:
    out().print()
    out().print(Text(f"{number}. FineTuner(method='lora'): fine-tune a tiny Llama on shoal's "
                     "instruction set", style="bold cyan"))
    # bitsandbytes warns at import when an optional CPU kernel package is absent
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    started = time.monotonic()
    from shoal.core.experiments import run_owner
    from shoal.experiments import Run
    from shoal.llm import CHAT_TEMPLATE, FineTuner, create_tiny_model

    with tempfile.TemporaryDirectory(prefix="shoal-demo-llm-") as tmp, \
            as_file(files("shoal.llm").joinpath("data/shoal_instructions.jsonl")) as data:
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        texts = [f"{r['instruction']} {r['context']} {r['response']}" for r in rows]
        base = create_tiny_model(Path(tmp) / "base", texts * 4, vocab_size=768,
                                 hidden_size=128, num_layers=2, chat_template=CHAT_TEMPLATE)
        out().print(Text(f"   base: a random-init Llama (2 layers, hidden 128) and a tokenizer "
                         f"trained on {data.name} ({len(rows)} instruction/response pairs)",
                         style="dim"))
        experiment, run_name = "llm-demo", f"lora-{int(time.time())}"
        with Run(experiment_name=experiment, run_name=run_name):
            # lora: on a CPU, bitsandbytes' 4-bit kernels make qlora ~20x slower (same recipe)
            tuner = FineTuner(str(base), method="lora", max_steps=80, batch_size=8,
                              learning_rate=1e-2, lr_scheduler="constant", logging_steps=10,
                              r=16, lora_alpha=32, save_steps=40,
                              environment={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
            tuner.fit({"training": str(data)}, logs=False)
        job = tuner.latest_training_job.name if tuner.latest_training_job else "?"
        points = [p for p in session.metadata.get_metrics(run_owner(experiment, run_name))
                  if p.name == "loss"]
        trail = "  ".join(f"{p.step}: {p.value:.2f}" for p in sorted(points,
                                                                     key=lambda p: p.step or 0))
        out().print(Text(f"   job {job}: loss by step, from run {experiment}/{run_name}:"))
        out().print(Text(f"     {trail}"))
        answer = _generate(tuner.model_data, Path(tmp) / "merged")
        out().print(Text(f"   merged model (model.tar.gz: safetensors, tokenizer, adapter/, "
                         f"serving.properties) asked {_QUESTION!r}:"))
        out().print(Text(f"     {answer!r}", style="green"))
        out().print(Text(f"   {time.monotonic() - started:.1f}s. Find them again: shoal "
                         f"{state.home_option()}jobs describe {job}; shoal "
                         f"{state.home_option()}runs show {run_name} -e {experiment}",
                         style="dim"))
        from shoal.cli._demo_llm_serving import run_llm_serving_demo

        run_llm_serving_demo(Path(tmp) / "merged", _QUESTION, number + 1)


def _generate(model_data: str, where: Path) -> str:
    import fsspec
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with fsspec.open(model_data, "rb") as f:
        extract_tar(f, where, label=f"model_data {model_data}")
    tok = AutoTokenizer.from_pretrained(where)
    model = AutoModelForCausalLM.from_pretrained(where).eval()
    prompt = tok.apply_chat_template([{"role": "user", "content": _QUESTION}], tokenize=False,
                                     add_generation_prompt=True)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")
    with contextlib.suppress(AttributeError):  # generation's own length warning is noise here
        model.generation_config.max_length = None
    generated = model.generate(**ids, max_new_tokens=24, do_sample=False,
                               pad_token_id=tok.pad_token_id)
    return str(tok.decode(generated[0][ids["input_ids"].shape[1]:], skip_special_tokens=True))
