"""QLoRA on a Llama-2-7B-shaped model: peak GPU memory and training tokens/s (issue #7).

Self-contained: needs only torch, transformers, peft, bitsandbytes and accelerate from PyPI
(no shoal, no downloads). The 7B model has random weights, built the fast honest way: the
module tree is created on the meta device (no memory), then each decoder layer is given real
bf16 weights on the GPU and its seven linear layers are quantized to NF4 (double
quantization) at once, so at most one layer (~0.4 GB) is ever in bf16. The result is what
``from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True, ...))``
gives, without writing or reading 13 GB of checkpoint. Then, as shoal's recipe does:
``prepare_model_for_kbit_training`` (gradient checkpointing), LoRA on every linear layer but
the head, bf16 compute (fp16 where the GPU lacks bf16), AdamW on the adapters.

    python bench/qlora_gpu.py                 # 7B shape, seq 512, batch 1, 10 timed steps
    python bench/qlora_gpu.py --steps 20 --r 64

It stops at once, saying so, when no CUDA GPU is visible. ``--device cpu`` with a small
``--layers/--hidden`` shape checks the script itself on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    return p.parse_args()


def _fail_without_cuda(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        sys.stderr.write(
            "qlora_gpu.py needs an NVIDIA GPU with CUDA: torch sees none "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). Run it on "
            "a GPU machine with a CUDA build of torch; --device cpu --layers 2 --hidden 256 "
            "only checks the script.\n")
        sys.exit(2)


def build_4bit_llama(a: argparse.Namespace, dtype, device):  # type: ignore[no-untyped-def]
    """A random-weight LlamaForCausalLM with NF4 linear layers, built layer by layer."""
    import bitsandbytes as bnb
    import torch
    from torch import nn
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=a.hidden, num_hidden_layers=a.layers,
                         num_attention_heads=a.heads, num_key_value_heads=a.heads,
                         intermediate_size=a.intermediate, vocab_size=a.vocab,
                         max_position_embeddings=4096, tie_word_embeddings=False)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)

    def materialise(module: nn.Module) -> None:
        module.to_empty(device=device, recurse=True)
        with torch.no_grad():
            for p in module.parameters(recurse=True):
                if p.ndim >= 2:
                    p.normal_(0.0, config.initializer_range)
                else:
                    p.fill_(1.0)  # RMSNorm weights

    for part in (model.model.embed_tokens, model.model.norm, model.lm_head):
        materialise(part)
    model.model.rotary_emb = LlamaRotaryEmbedding(config=config).to(device)
    for layer in model.model.layers:
        materialise(layer)
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if not isinstance(child, nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=False,
                                      compute_dtype=dtype, compress_statistics=True,
                                      quant_type="nf4", device="meta")
                weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False,
                                           compress_statistics=True, quant_type="nf4",
                                           module=q)
                q.weight = weight._quantize(device)
                setattr(parent, name, q)
                del child
        if device.type == "cuda":
            torch.cuda.empty_cache()
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()]
                if t.device.type == "meta"]
    if leftover:
        raise RuntimeError(f"not materialised: {leftover[:5]}")
    model.is_loaded_in_4bit = True  # what from_pretrained sets; peft picks its 4-bit LoRA
    model.config.use_cache = False
    return model


def main() -> None:
    a = _args()
    _fail_without_cuda(a.device)
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    device = torch.device(a.device)
    if a.device == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        name = torch.cuda.get_device_name()
    else:
        dtype, name = torch.float32, "cpu"
    t0 = time.perf_counter()
    model = build_4bit_llama(a, dtype, device)
    model = prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False})
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=a.r, lora_alpha=a.lora_alpha, lora_dropout=0.05,
                                             target_modules=targets, task_type="CAUSAL_LM"))
    build_s = time.perf_counter() - t0
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    build_peak = torch.cuda.max_memory_allocated() if a.device == "cuda" else 0
    model.train()
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen).to(device)
    if a.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses = []
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            if a.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        with torch.autocast(device_type=a.device, dtype=dtype, enabled=a.device == "cuda"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(round(float(loss.detach()), 4))
    if a.device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if a.device == "cuda" else 0
    tokens_s = a.steps * a.batch * a.seq / elapsed
    result = {
        "device": name, "shape": f"{a.layers} layers, hidden {a.hidden}, heads {a.heads}, "
        f"intermediate {a.intermediate}, vocab {a.vocab}", "seq": a.seq, "batch": a.batch,
        "compute_dtype": str(dtype).removeprefix("torch."), "lora_r": a.r,
        "trainable_params": trainable, "build_seconds": round(build_s, 1),
        "build_peak_gib": round(build_peak / 2**30, 2),
        "train_peak_gib": round(peak / 2**30, 2), "tokens_per_second": round(tokens_s, 1),
        "seconds_per_step": round(elapsed / a.steps, 3), "losses": losses,
    }
    print(f"QLoRA (NF4, double quant, {result['compute_dtype']} compute, gradient "
          f"checkpointing, LoRA r={a.r} on 7 linear layers x {a.layers}) on {name}")
    print(f"  model built in {build_s:.1f} s (peak {result['build_peak_gib']} GiB)")
    print(f"  training peak GPU memory (torch.cuda.max_memory_allocated): "
          f"{result['train_peak_gib']} GiB")
    print(f"  throughput: {tokens_s:.0f} tokens/s ({elapsed / a.steps:.3f} s/step, seq {a.seq},"
          f" batch {a.batch}, {a.steps} timed steps)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
