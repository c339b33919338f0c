"""``finetune()``: the LoRA/QLoRA recipe, run in this process (locally, in ``@remote``, or as
the entry script of a ``FineTuner`` job).

Load the base (4 bits for qlora), add LoRA adapters to its linear layers, train with
transformers' ``Trainer`` (resuming from the latest checkpoint in *checkpoint_dir*), report
loss and learning rate per step to stdout and to the experiment run, then merge and save.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from shoal._internal.extras import require
from shoal.errors import InvalidArgumentError
from shoal.llm import _base, _data, _export
from shoal.llm._options import DataFormat, FineTuneMethod, FineTuneOptions

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, TrainingArguments

    from shoal.experiments.run import Run

__all__ = ["FineTuneResult", "finetune", "latest_checkpoint"]

logger = logging.getLogger(__name__)


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: ``run=`` not given: use the experiment run open here (or the job's), if any.
UNSET: Any = _Unset()


@dataclass(frozen=True, slots=True)
class FineTuneResult:
    """What ``finetune()`` produced.

    ``model_dir`` holds the merged model (None when a large model went to ``model_uri``),
    ``adapter_dir`` the adapter alone; ``losses`` is ``(step, loss)`` per logged step;
    ``train_runtime`` is the trainer's wall time, ``train_cpu_seconds`` this process's CPU
    time while training (a fair measure on a shared machine).
    """

    output_dir: Path
    model_dir: Path | None
    adapter_dir: Path
    model_uri: str | None
    method: FineTuneMethod
    data_format: DataFormat
    global_step: int
    losses: tuple[tuple[int, float], ...]
    eval_loss: float | None
    train_examples: int
    truncated: int
    train_runtime: float
    train_cpu_seconds: float
    tokens_seen: int
    tokens_per_second: float
    resumed_from: str | None
    merged_dtype: str


def finetune(base_model: str | os.PathLike[str], train_data: str | os.PathLike[str], *,
             output_dir: str | os.PathLike[str], validation_data: str | os.PathLike[str] |
             None = None, checkpoint_dir: str | os.PathLike[str] | None = None,
             options: FineTuneOptions | None = None, run: Any = UNSET,
             model_prefix_uri: str | None = None, stream: TextIO | None = None,
             **knobs: Any) -> FineTuneResult:
    """Fine-tune *base_model* on *train_data* with LoRA (``method="lora"``) or QLoRA.

    Args:
        base_model: a model directory, an fsspec URI (fetched once, cached under SHOAL_HOME)
            or a Hugging Face hub id (from the local cache, or the hub when reachable).
        train_data: a JSONL file, a folder of them, or a ``datasets`` directory with
            ``text``, ``prompt``/``completion``, ``instruction``/``context``/``response`` or
            chat ``messages`` records.
        output_dir: receives the merged model, ``adapter/``, ``serving.properties`` and
            ``shoal-finetune.json``.
        validation_data: evaluated every ``eval_steps``; else ``validation_split`` of the data.
        checkpoint_dir: Trainer checkpoints; a second call with the same directory resumes
            from the latest one. Default: a temporary directory (no resume).
        options / knobs: ``FineTuneOptions`` fields (``method``, ``r``, ``max_steps``...).
        run: an experiment ``Run`` for loss and learning rate per step; by default the run
            open here or the job's run (``load_run()``), None for none.
        model_prefix_uri: where a merged model above ``large_model_threshold_mb`` is stored
            (set by ``FineTuner``; without it the model always stays in *output_dir*).
        stream: where the ``loss=... learning_rate=... step=...`` lines go (stdout).

    Example:
        >>> from shoal.llm import finetune                              # doctest: +SKIP
        >>> result = finetune("models/base", "data/train.jsonl", output_dir="out",
        ...                   method="lora", max_steps=100)
        >>> result.losses[-1]                                           # doctest: +SKIP
    """
    require("llm", "shoal.llm.finetune", "torch", "transformers", "peft")
    opts = FineTuneOptions.build(options, **knobs)
    out = Path(output_dir).expanduser().resolve()
    started = time.monotonic()
    device = _device()
    base_path = _base.resolve_base_model(str(base_model), cache_root=_cache_root())
    if opts.method == FineTuneMethod.QLORA:
        _base.check_bitsandbytes(device)  # before the data work: fail fast, say why
    tokenizer = _tokenizer(base_path, opts)
    train, val, shape = _examples(train_data, validation_data, tokenizer, opts)
    logger.info("training data: %d %s example(s)%s", len(train), shape.value,
                f", {len(val)} for validation" if val is not None else "")
    model = _base.load_for_training(base_path, opts, device)
    targets = _base.check_target_modules(model, opts.target_modules)
    from peft import get_peft_model

    model = get_peft_model(model, _base.lora_config(opts, targets))
    out.mkdir(parents=True, exist_ok=True)
    adapter_dir = out / "adapter"
    with _CheckpointDir(checkpoint_dir) as ckpt:
        trained = _train(model, tokenizer, train, val, opts, device, ckpt,
                         _find_run(run), stream or sys.stdout)
        model.save_pretrained(str(adapter_dir))
    del model
    merged_dtype = _export.merge_and_save(base_path=base_path, adapter_dir=adapter_dir,
                                          output_dir=out, tokenizer=tokenizer, opts=opts,
                                          device=device)
    model_uri = None
    limit = opts.large_model_threshold_mb * 1e6
    if model_prefix_uri and _export.model_bytes(out) > limit:
        model_uri = _export.store_large_model(out, model_prefix_uri, opts, merged_dtype)["uri"]
    result = FineTuneResult(
        output_dir=out, model_dir=None if model_uri else out, adapter_dir=adapter_dir,
        model_uri=model_uri, method=opts.method, data_format=shape, merged_dtype=merged_dtype,
        train_examples=len(train), truncated=train.truncated, **trained)
    _write_summary(out, str(base_model), opts, result, time.monotonic() - started)
    return result


# --- pieces ------------------------------------------------------------------------------

def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _cache_root() -> Path:
    from shoal.config import Settings

    return Path(Settings().home) / "cache" / "models"


def _tokenizer(base_path: Path, opts: FineTuneOptions) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_path,
                                              trust_remote_code=opts.trust_remote_code)
    if tokenizer.pad_token is None:  # Llama's tokenizers have none; padding is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _examples(train_data: Any, validation_data: Any, tokenizer: PreTrainedTokenizerBase,
              opts: FineTuneOptions) -> tuple[_data.Examples, _data.Examples | None, DataFormat]:
    source = str(train_data)
    records, val_records = _data.load_records(train_data)
    if not records:
        raise InvalidArgumentError(f"training data {source} has no examples: nothing to train "
                                   "on", path=source)
    shape = _data.detect_format(records, opts.data_format, source)
    if shape == DataFormat.CHAT and not tokenizer.chat_template:
        logger.info("the tokenizer has no chat template: using shoal's (saved with the model)")
        tokenizer.chat_template = _data.CHAT_TEMPLATE
    val_source = source
    if validation_data is not None:
        val_source = str(validation_data)
        val_records, _ = _data.load_records(validation_data)
    elif val_records is None and opts.validation_split > 0:
        records, val_records = _data.split(records, opts.validation_split, opts.seed)
    train = _data.prepare(records, tokenizer, opts, shape, source)
    val = None
    if val_records is not None:
        val_shape = _data.detect_format(val_records, opts.data_format, val_source) \
            if val_records else shape
        val = _data.prepare(val_records, tokenizer, opts, val_shape, f"{val_source} "
                            "(validation)")
    return train, val, shape


class _CheckpointDir:
    """The checkpoint directory: the caller's (kept), or a temporary one (removed)."""

    def __init__(self, given: str | os.PathLike[str] | None) -> None:
        self.given = Path(given).expanduser().resolve() if given is not None else None
        self.path = self.given

    def __enter__(self) -> Path:
        if self.path is None:
            self.path = Path(tempfile.mkdtemp(prefix="shoal-ckpt-"))
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def __exit__(self, *exc: object) -> None:
        if self.given is None and self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete ``checkpoint-N`` in *directory* (its trainer state written last)."""
    found = []
    for d in directory.glob("checkpoint-*"):
        step = d.name.removeprefix("checkpoint-")
        if not (d.is_dir() and step.isdigit()):
            continue
        try:
            state = json.loads((d / "trainer_state.json").read_text())
        except (OSError, ValueError):
            logger.warning("skipping incomplete checkpoint %s", d)
            continue
        if state.get("global_step") == int(step) and any(d.glob("adapter_model.*")):
            found.append((int(step), d))
    return max(found)[1] if found else None


def _find_run(run: Run | None) -> Run | None:  # run may be UNSET: look for one
    if run is not UNSET:
        return run
    try:
        from shoal.experiments import load_run
    except ImportError:
        return None
    try:
        return load_run()
    except InvalidArgumentError:  # no run here, and not a job started inside one
        return None


def _train(model: Any, tokenizer: PreTrainedTokenizerBase, train: _data.Examples,
           val: _data.Examples | None, opts: FineTuneOptions, device: str, ckpt: Path,
           run: Run | None, stream: TextIO) -> dict[str, Any]:
    from transformers import PrinterCallback, Trainer

    from shoal.llm._callbacks import MetricsCallback, TokenCounter

    counter = TokenCounter(_data.collate(tokenizer.pad_token_id))
    metrics = MetricsCallback(run, stream)
    trainer = Trainer(model=model, args=_training_args(opts, device, ckpt, val is not None),
                      train_dataset=train, eval_dataset=val, data_collator=counter,
                      callbacks=[metrics])
    trainer.remove_callback(PrinterCallback)  # our lines replace its dicts
    resume = latest_checkpoint(ckpt)
    if resume is not None:
        logger.warning("resuming from checkpoint %s", resume)
        stream.write(f"resuming from {resume.name}\n")
    cpu = time.process_time()
    output = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    cpu = time.process_time() - cpu
    runtime = float(output.metrics.get("train_runtime", 0.0))
    eval_loss = None
    if val is not None:
        eval_loss = float(trainer.evaluate()["eval_loss"])
        metrics.report({"eval_loss": eval_loss}, trainer.state.global_step)
    metrics.flush()
    return {"global_step": int(trainer.state.global_step), "losses": tuple(metrics.losses),
            "eval_loss": eval_loss, "train_runtime": runtime, "train_cpu_seconds": cpu,
            "tokens_seen": counter.tokens,
            "tokens_per_second": counter.tokens / runtime if runtime > 0 else 0.0,
            "resumed_from": resume.name if resume else None}


def _training_args(opts: FineTuneOptions, device: str, ckpt: Path, has_eval: bool
                   ) -> TrainingArguments:
    import torch
    from transformers import TrainingArguments

    dtype = _base.resolve_dtype(opts.dtype, device)
    eval_steps = opts.eval_steps or opts.save_steps
    return TrainingArguments(
        output_dir=str(ckpt), num_train_epochs=opts.epochs, max_steps=opts.max_steps or -1,
        per_device_train_batch_size=opts.batch_size, per_device_eval_batch_size=opts.batch_size,
        gradient_accumulation_steps=opts.gradient_accumulation_steps,
        learning_rate=opts.learning_rate, lr_scheduler_type=opts.lr_scheduler,
        warmup_steps=opts.warmup_ratio, weight_decay=opts.weight_decay, optim=opts.optim,
        logging_steps=opts.logging_steps, logging_first_step=True, save_strategy="steps",
        save_steps=opts.save_steps, save_total_limit=opts.save_total_limit,
        eval_strategy="steps" if has_eval else "no", eval_steps=eval_steps if has_eval else None,
        seed=opts.seed, data_seed=opts.seed, report_to="none", disable_tqdm=True,
        remove_unused_columns=False, dataloader_num_workers=0, use_cpu=device == "cpu",
        bf16=device == "cuda" and dtype == torch.bfloat16,
        fp16=device == "cuda" and dtype == torch.float16,
        # checkpointing is switched on on the model itself, before the adapters are added
        gradient_checkpointing=False)


def _write_summary(out: Path, base_model: str, opts: FineTuneOptions, result: FineTuneResult,
                   seconds: float) -> None:
    summary = {
        "base_model": base_model, "options": opts.as_dict(), "method": opts.method.value,
        "data_format": result.data_format.value, "global_step": result.global_step,
        "losses": [list(p) for p in result.losses], "eval_loss": result.eval_loss,
        "train_examples": result.train_examples, "truncated": result.truncated,
        "train_runtime": result.train_runtime, "tokens_seen": result.tokens_seen,
        "tokens_per_second": result.tokens_per_second, "resumed_from": result.resumed_from,
        "merged_dtype": result.merged_dtype, "model_uri": result.model_uri,
        "seconds": seconds,
    }
    (out / _export.SUMMARY).write_text(json.dumps(summary, indent=2))
