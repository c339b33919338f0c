"""A tiny LLM the serving tests share: a random-init Llama (hidden 64, 2 layers) with a BPE
tokenizer trained on local text and a chat template, written by ``shoal.llm``'s
``create_tiny_model`` beside a ``serving.properties``; and the reference answers, from
transformers' own ``generate()`` on the same weights."""

from __future__ import annotations

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


def make_tiny_llm(directory: Path, **properties: object) -> Path:
    """The model and tokenizer, and a serving.properties with *properties* (``option.``
    keys given with dots replaced: ``option_dtype="fp32"``)."""
    from shoal.llm import create_tiny_model, write_serving_properties

    create_tiny_model(directory, TEXTS * 3, vocab_size=400, hidden_size=64, num_layers=2,
                      max_positions=MAX_POSITIONS, chat_template=CHAT_TEMPLATE)
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
