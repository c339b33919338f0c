"""Training data: read JSONL files or a ``datasets`` directory, detect the record shape, format
each record (with the tokenizer's chat template when it has one), tokenize, truncate, pack.

The result is plain lists of token ids and labels (``-100`` where no loss is taken); the
trainer sees them through ``collate``. torch is imported only by ``collate``.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.errors import InvalidArgumentError
from shoal.llm._options import DataFormat, FineTuneOptions

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["Examples", "detect_format", "load_records", "prepare"]

logger = logging.getLogger(__name__)

IGNORE = -100
_KNOWN = "text, prompt/completion, instruction/context/response (Dolly), messages (chat)"
_VALIDATION_SPLITS = ("validation", "valid", "val", "test", "eval")
#: Used for chat data when the tokenizer has no template; saved with the merged model.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@dataclass(frozen=True, slots=True)
class Examples:
    """Tokenized sequences ready for the trainer."""

    input_ids: list[list[int]]
    labels: list[list[int]]
    truncated: int = 0
    longest: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.input_ids)


# --- reading -------------------------------------------------------------------------------

def load_records(source: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(training records, validation records or None) from a file or a directory.

    A directory is either what ``datasets``' ``save_to_disk`` wrote (a ``DatasetDict``'s
    validation split is used as the validation data) or a folder of JSONL files.
    """
    path = Path(source).expanduser()
    if not path.exists():
        raise InvalidArgumentError(f"training data {source} does not exist", path=str(path))
    if path.is_file():
        return _read_json_file(path), None
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        return _read_saved_dataset(path)
    files = sorted(p for p in path.rglob("*") if p.suffix in (".jsonl", ".json") and
                   p.is_file() and not p.name.startswith("."))
    if not files:
        found = sorted(p.name for p in path.iterdir())[:20]
        raise InvalidArgumentError(
            f"training data {source} holds neither JSONL files nor a datasets directory "
            f"(save_to_disk); found: {', '.join(found) or 'nothing'}", path=str(path))
    records: list[dict[str, Any]] = []
    for f in files:
        records += _read_json_file(f)
    return records, None


def _read_json_file(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except ValueError as e:
            raise InvalidArgumentError(f"{path}: not valid JSON: {e}", path=str(path)) from e
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise InvalidArgumentError(f"{path}:{lineno}: not a JSON line: {e}",
                                           path=str(path), line=lineno) from e
    records: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InvalidArgumentError(f"{path}: record {i + 1} is a {type(row).__name__}, "
                                       "not a JSON object", path=str(path))
        records.append(row)
    return records


def _read_saved_dataset(path: Path) -> tuple[list[dict[str, Any]],
                                             list[dict[str, Any]] | None]:
    try:
        from datasets import Dataset, DatasetDict, load_from_disk
    except ImportError as e:
        raise InvalidArgumentError(f"{path} is a datasets directory; reading it needs the "
                                   "datasets package: pip install 'shoal[llm]'") from e
    loaded = load_from_disk(str(path))
    if isinstance(loaded, Dataset):
        return loaded.to_list(), None
    if not isinstance(loaded, DatasetDict) or not loaded:
        raise InvalidArgumentError(f"{path} holds no dataset", path=str(path))
    names = list(loaded)
    train = "train" if "train" in loaded else names[0]
    val = next((n for n in _VALIDATION_SPLITS if n in loaded and n != train), None)
    return loaded[train].to_list(), loaded[val].to_list() if val else None


# --- shapes --------------------------------------------------------------------------------

def detect_format(records: Sequence[dict[str, Any]], requested: DataFormat,
                  source: str) -> DataFormat:
    """The record shape: the requested one (checked) or the first known one the fields fit."""
    fields = set(records[0]) if records else set()
    found = {
        DataFormat.CHAT: "messages" in fields,
        DataFormat.PROMPT_COMPLETION: {"prompt", "completion"} <= fields,
        DataFormat.INSTRUCTION: {"instruction", "response"} <= fields,
        DataFormat.TEXT: "text" in fields,
    }
    if requested != DataFormat.AUTO:
        if not found[requested]:
            raise InvalidArgumentError(
                f"data_format={requested.value}, but the records of {source} have the fields "
                f"{', '.join(sorted(fields)) or 'none'}", data_format=requested.value)
        return requested
    for shape, fits in found.items():
        if fits:
            return shape
    raise InvalidArgumentError(
        f"the records of {source} have none of the known fields ({_KNOWN}); found the fields "
        f"{', '.join(sorted(fields)) or 'none'}. Rename them, or convert the data",
        found=sorted(fields))


def _field(record: dict[str, Any], name: str, i: int, source: str) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        raise InvalidArgumentError(f"record {i + 1} of {source}: field {name!r} must be a "
                                   f"string, got {type(value).__name__}", field=name)
    return value


def _split_text(record: dict[str, Any], shape: DataFormat, tokenizer: PreTrainedTokenizerBase,
                i: int, source: str) -> tuple[str, str]:
    """(prompt, completion) as text: the loss is taken on the completion."""
    if shape == DataFormat.TEXT:
        return "", _field(record, "text", i, source)
    if shape == DataFormat.CHAT:
        messages = record.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and "role" in m
                for m in messages):
            raise InvalidArgumentError(f"record {i + 1} of {source}: messages must be a list "
                                       "of {'role', 'content'} objects", field="messages")
        return _chat(tokenizer, messages)
    if shape == DataFormat.PROMPT_COMPLETION:
        prompt = _field(record, "prompt", i, source)
        completion = _field(record, "completion", i, source)
    else:
        instruction = _field(record, "instruction", i, source)
        context = record.get("context") or ""
        completion = _field(record, "response", i, source)
        if tokenizer.chat_template:
            prompt = f"{instruction}\n\n{context}" if context else instruction
        else:
            prompt = f"### Instruction:\n{instruction}\n\n"
            if context:
                prompt += f"### Context:\n{context}\n\n"
            prompt += "### Response:\n"
    if tokenizer.chat_template:
        return _chat(tokenizer, [{"role": "user", "content": prompt},
                                 {"role": "assistant", "content": completion}])
    return prompt, completion


def _chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> tuple[str, str]:
    full = _template(tokenizer, messages)
    if messages[-1].get("role") != "assistant":
        return "", full
    prompt = _template(tokenizer, messages[:-1], add_generation_prompt=True)
    if not full.startswith(prompt):
        return "", full
    return prompt, full[len(prompt):]


def _template(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], *,
              add_generation_prompt: bool = False) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    assert isinstance(text, str)  # tokenize=False: the template's text
    return text


# --- tokens --------------------------------------------------------------------------------

def prepare(records: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase,
            opts: FineTuneOptions, shape: DataFormat, source: str) -> Examples:
    """Tokenized examples (truncated to max_seq_length, packed when asked)."""
    if not records:
        raise InvalidArgumentError(f"{source} has no examples: nothing to train on",
                                   path=source)
    templated = bool(tokenizer.chat_template) and shape != DataFormat.TEXT
    eos = tokenizer.eos_token_id
    limit = opts.max_seq_length
    ids_all: list[list[int]] = []
    labels_all: list[list[int]] = []
    truncated = longest = 0
    for i, record in enumerate(records):
        prompt, completion = _split_text(record, shape, tokenizer, i, source)
        # A chat template writes its own special tokens; plain text gets the tokenizer's.
        p_ids = tokenizer(prompt, add_special_tokens=not templated)["input_ids"] if prompt \
            else []
        c_ids = tokenizer(completion, add_special_tokens=not templated and not prompt
                          )["input_ids"]
        if eos is not None and (not c_ids or c_ids[-1] != eos):
            c_ids = [*c_ids, eos]
        ids = p_ids + c_ids
        mask_prompt = shape != DataFormat.TEXT and not opts.train_on_prompt
        labels = ([IGNORE] * len(p_ids) if mask_prompt else list(p_ids)) + c_ids
        longest = max(longest, len(ids))
        if len(ids) > limit:
            truncated += 1
            ids, labels = ids[:limit], labels[:limit]
        ids_all.append(ids)
        labels_all.append(labels)
    if truncated:
        logger.warning("%d of %d example(s) of %s are longer than max_seq_length=%d tokens and "
                       "were truncated (the longest has %d)", truncated, len(records), source,
                       limit, longest)
    if opts.packing:
        ids_all, labels_all = _pack(ids_all, labels_all, limit)
    return Examples(ids_all, labels_all, truncated, longest)


def _pack(ids: list[list[int]], labels: list[list[int]], size: int
          ) -> tuple[list[list[int]], list[list[int]]]:
    flat_ids = [t for seq in ids for t in seq]
    flat_labels = [t for seq in labels for t in seq]
    blocks = range(0, len(flat_ids), size)
    return ([flat_ids[i:i + size] for i in blocks], [flat_labels[i:i + size] for i in blocks])


def split(records: list[dict[str, Any]], fraction: float, seed: int
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, validation): *fraction* of the records held out, chosen with *seed*."""
    if len(records) < 2:
        raise InvalidArgumentError(f"validation_split={fraction} needs at least 2 records, "
                                   f"the data has {len(records)}", argument="validation_split")
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_val = min(len(records) - 1, max(1, round(len(records) * fraction)))
    held = set(order[:n_val])
    return ([r for i, r in enumerate(records) if i not in held],
            [r for i, r in enumerate(records) if i in held])


def collate(pad_id: int) -> Callable[[list[dict[str, list[int]]]], dict[str, torch.Tensor]]:
    """A collator that pads a batch to its longest sequence (labels with -100)."""
    import torch

    def collate_batch(batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        width = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, b in enumerate(batch):
            n = len(b["input_ids"])
            ids[row, :n] = torch.tensor(b["input_ids"], dtype=torch.long)
            labels[row, :n] = torch.tensor(b["labels"], dtype=torch.long)
            mask[row, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    return collate_batch
