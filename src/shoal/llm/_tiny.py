"""A tiny random-initialised Llama with a tokenizer trained on given text: a real model
directory for demos, tests and benchmarks on machines that cannot download weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from shoal._internal.extras import needs_extra

__all__ = ["create_tiny_model"]

_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


@needs_extra("llm", "shoal.llm.create_tiny_model")
def create_tiny_model(directory: str | Path, texts: Iterable[str], *, vocab_size: int = 512,
                      hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                      intermediate_size: int | None = None, max_positions: int = 512,
                      seed: int = 0, chat_template: str | None = None,
                      initializer_range: float = 0.2) -> Path:
    """Write a random-init ``LlamaForCausalLM`` and a byte-level BPE tokenizer to *directory*.

    The tokenizer is trained on *texts*; ``chat_template`` (a Jinja template) is saved with it
    when given. The weights are drawn wider than Llama's 0.02 (``initializer_range``): with the
    output head and norms frozen, as LoRA keeps them, a 64-wide model initialised at 0.02
    cannot make any next token likely, so nothing could be learnt. Loads back with ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``.

    Example:
        >>> create_tiny_model("/tmp/tiny", ["hello world"] * 10)        # doctest: +SKIP
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(texts), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                        eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    if chat_template:
        tokenizer.chat_template = chat_template
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2), max_position_embeddings=max_positions,
        bos_token_id=bos, eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("<pad>"), tie_word_embeddings=False,
        initializer_range=initializer_range)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
