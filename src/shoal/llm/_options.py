"""``FineTuneOptions``: every knob of the fine-tuning recipe, declared once.

``finetune()``, ``FineTuner`` (as hyperparameters) and ``shoal llm finetune`` (as flags) are
all built from the fields below, so the three take the same options with the same defaults.
Standard library only: the CLI and the estimator read it without importing torch.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shoal.errors import InvalidArgumentError

__all__ = ["DataFormat", "FineTuneMethod", "FineTuneOptions", "LR_SCHEDULERS", "TORCH_DTYPES"]


class FineTuneMethod(enum.StrEnum):
    """How the base model is adapted."""

    QLORA = "qlora"  # base in 4 bits (bitsandbytes), LoRA adapters on top
    LORA = "lora"    # the same adapters on a full-precision base


class DataFormat(enum.StrEnum):
    """The shape of a training record; ``auto`` detects it from the fields."""

    AUTO = "auto"
    TEXT = "text"                            # {"text"}
    PROMPT_COMPLETION = "prompt_completion"  # {"prompt", "completion"}
    INSTRUCTION = "instruction"              # Dolly: {"instruction", "context"?, "response"}
    CHAT = "chat"                            # {"messages": [{"role", "content"}, ...]}


#: Learning-rate schedules of transformers' ``get_scheduler``.
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
                 "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr",
                 "warmup_stable_decay")
#: ``auto`` picks by device: float32 on CPU; bfloat16 on a GPU that has it, else float16.
TORCH_DTYPES = ("auto", "float32", "bfloat16", "float16")


_T = TypeVar("_T")


def _knob(default: _T, help: str, **more: object) -> _T:
    return field(default=default, metadata={"help": help, **more})


@dataclass(frozen=True, slots=True)
class FineTuneOptions:
    """The recipe's options; every field is a keyword of ``finetune()`` and ``FineTuner``.

    Example:
        >>> FineTuneOptions(method="lora", r=8).r
        8
    """

    method: FineTuneMethod = _knob(FineTuneMethod.QLORA, "qlora (4-bit base) or lora")
    r: int = _knob(16, "LoRA rank")
    lora_alpha: int = _knob(32, "LoRA scaling numerator (scale = lora_alpha / r)")
    lora_dropout: float = _knob(0.05, "dropout on the LoRA input")
    target_modules: tuple[str, ...] | None = _knob(
        None, "layer names to adapt; default: every linear layer but the output head")
    epochs: float = _knob(1.0, "passes over the training data (unless max_steps is set)")
    max_steps: int | None = _knob(None, "optimizer steps to run; overrides epochs")
    learning_rate: float = _knob(2e-4, "peak learning rate")
    lr_scheduler: str = _knob("cosine", "learning-rate schedule", choices=LR_SCHEDULERS)
    warmup_ratio: float = _knob(0.03, "fraction of the steps spent warming up")
    weight_decay: float = _knob(0.0, "AdamW weight decay")
    batch_size: int = _knob(4, "sequences per device per step")
    gradient_accumulation_steps: int = _knob(1, "micro-batches per optimizer step")
    max_seq_length: int = _knob(1024, "tokens per sequence; longer ones are truncated")
    packing: bool = _knob(False, "concatenate examples into full max_seq_length blocks")
    gradient_checkpointing: bool = _knob(True, "recompute activations to save memory")
    seed: int = _knob(42, "random seed (data order, adapter init, split)", min=0)
    data_format: DataFormat = _knob(DataFormat.AUTO, "record shape; auto detects it")
    train_on_prompt: bool = _knob(False, "also compute the loss on prompt tokens")
    validation_split: float = _knob(
        0.0, "fraction of the training data held out when no validation data is given")
    logging_steps: int = _knob(10, "report loss and learning rate every N steps")
    save_steps: int = _knob(100, "write a checkpoint every N steps")
    save_total_limit: int = _knob(2, "checkpoints kept locally")
    eval_steps: int | None = _knob(None, "evaluate every N steps (default: save_steps)")
    dtype: str = _knob("auto", "qlora: compute dtype; lora: the base's dtype",
                       choices=TORCH_DTYPES)
    quant_type: str = _knob("nf4", "4-bit data type (qlora)", choices=("nf4", "fp4"))
    double_quant: bool = _knob(True, "quantize the quantization constants too (qlora)")
    merge_dtype: str = _knob("auto", "precision of the merged model", choices=TORCH_DTYPES)
    optim: str = _knob("adamw_torch", "optimizer name of transformers' TrainingArguments")
    rolling_batch: str = _knob("auto", "serving.properties option.rolling_batch")
    max_model_len: int | None = _knob(
        None, "serving.properties option.max_model_len (default: max_seq_length)")
    large_model_threshold_mb: float = _knob(
        2048.0, "in a job, a merged model above this size is stored under a prefix with a "
                "manifest instead of inside model.tar.gz")
    trust_remote_code: bool = _knob(False, "allow the base model's own modelling code")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _check(f, getattr(self, f.name)))
        if self.lora_alpha <= 0:
            _bad("lora_alpha", self.lora_alpha, "a positive integer")
        if not 0.0 <= self.lora_dropout < 1.0:
            _bad("lora_dropout", self.lora_dropout, "a number in [0, 1)")
        if not 0.0 <= self.validation_split < 1.0:
            _bad("validation_split", self.validation_split, "a number in [0, 1)")
        if not 0.0 <= self.warmup_ratio < 1.0:
            _bad("warmup_ratio", self.warmup_ratio, "a number in [0, 1)")
        if self.max_steps is None and self.epochs <= 0:
            _bad("epochs", self.epochs, "a positive number (or set max_steps)")
        if self.target_modules is not None and not self.target_modules:
            _bad("target_modules", self.target_modules, "at least one layer name, or None")

    # --- building ----------------------------------------------------------------------

    @classmethod
    def build(cls, options: FineTuneOptions | None = None, /, **knobs: Any) -> FineTuneOptions:
        """*options* (or the defaults) with *knobs* replaced; unknown names are refused."""
        unknown = sorted(set(knobs) - set(cls.names()))
        if unknown:
            raise InvalidArgumentError(
                f"unknown fine-tuning option(s) {', '.join(unknown)}; the options are "
                f"{', '.join(cls.names())}", arguments=unknown)
        base = options if options is not None else cls()
        return dataclasses.replace(base, **knobs) if knobs else base

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_strings(cls, values: Mapping[str, str]) -> FineTuneOptions:
        """Options from text (``--key value`` arguments of a job): each parsed by its type."""
        hints = _hints()
        unknown = sorted(set(values) - set(hints))
        if unknown:
            raise InvalidArgumentError(f"unknown fine-tuning option(s) {', '.join(unknown)}",
                                       arguments=unknown)
        return cls(**{k: _parse(k, hints[k], v) for k, v in values.items()})

    def changed(self) -> dict[str, Any]:
        """The options that differ from the defaults, JSON-ready (the job's hyperparameters)."""
        default = FineTuneOptions()
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                out[f.name] = _jsonable(value)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


# --- checks and parsing ---------------------------------------------------------------------

_HINTS: dict[str, Any] = {}


def _hints() -> dict[str, Any]:
    if not _HINTS:
        _HINTS.update(typing.get_type_hints(FineTuneOptions))
    return _HINTS


def _bad(name: str, value: Any, expected: str) -> typing.NoReturn:
    raise InvalidArgumentError(f"fine-tuning option {name}={value!r}: expected {expected}",
                               argument=name)


def _check(f: dataclasses.Field[Any], value: Any) -> Any:
    hint = _hints()[f.name]
    args = typing.get_args(hint)
    optional = type(None) in args
    if value is None:
        if optional:
            return None
        _bad(f.name, value, "a value")
    kind = next((a for a in args if a is not type(None)), hint) if optional else hint
    choices = f.metadata.get("choices")
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            _bad(f.name, value, "one of " + ", ".join(m.value for m in kind))
    if kind is bool:
        if not isinstance(value, bool):
            _bad(f.name, value, "true or false")
        return value
    if kind is int:
        low = f.metadata.get("min", 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            _bad(f.name, value, "a positive integer" if low == 1 else f"an integer >= {low}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            _bad(f.name, value, "a number")
        if value < 0:
            _bad(f.name, value, "a number >= 0")
        return float(value)
    if kind is str:
        if not isinstance(value, str) or not value:
            _bad(f.name, value, "a non-empty string")
        if choices and value not in choices:
            _bad(f.name, value, "one of " + ", ".join(choices))
        return value
    # tuple[str, ...]: a list, a tuple, or one comma-separated string
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v
                                                        for v in value):
        _bad(f.name, value, "a list of names")
    return tuple(value)


def _parse(name: str, hint: Any, text: str) -> Any:
    args = typing.get_args(hint)
    kind = next((a for a in args if a is not type(None)), hint) if args else hint
    if text in ("None", "null", "") and type(None) in args:
        return None
    if kind is str or (isinstance(kind, type) and issubclass(kind, enum.Enum)):
        return text
    if kind is bool:
        low = text.strip().lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        _bad(name, text, "true or false")
    if typing.get_origin(kind) is tuple:
        stripped = text.strip()
        if stripped.startswith("["):
            try:
                return json.loads(stripped)
            except ValueError as e:
                raise InvalidArgumentError(f"fine-tuning option {name}={text!r}: {e}",
                                           argument=name) from e
        return stripped
    try:
        number = json.loads(text)
    except ValueError:
        _bad(name, text, "a number")
    return number


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value
