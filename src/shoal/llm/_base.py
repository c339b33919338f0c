"""The base model: where it comes from (a directory, a URI, a hub id) and how it is loaded
for training (4 bits for ``qlora``, full precision for ``lora``), with the LoRA adapters.

Merging and saving live in ``_export.py``; the data in ``_data.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.errors import InvalidArgumentError, ModelNotFound, RuntimeEnvError
from shoal.llm._options import FineTuneMethod, FineTuneOptions

if TYPE_CHECKING:
    import types

    import torch
    from peft import LoraConfig

__all__ = ["check_target_modules", "linear_layer_names", "load_for_training", "lora_config",
           "resolve_base_model", "resolve_dtype"]

logger = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
# Weight formats torch-based transformers never loads: not worth downloading.
_HUB_IGNORE = ["*.gguf", "*.onnx", "*.onnx_data", "*.h5", "*.msgpack", "*.tflite", "original/*"]
_CACHE_MARK = ".shoal-complete.json"


# --- where the base model is ------------------------------------------------------------------

def resolve_base_model(base_model: str, *, cache_root: Path, hub_cache: str | None = None,
                       offline: bool | None = None) -> Path:
    """A local directory holding *base_model* (a directory, an fsspec URI or a hub id).

    URIs are fetched through the artifact store into *cache_root* (reused while the remote
    files are unchanged); hub ids come from the Hugging Face cache, or the hub when it is
    reachable and not switched off (``HF_HUB_OFFLINE``).
    """
    text = str(base_model)
    if not text:
        raise InvalidArgumentError("base_model is empty: give a model directory, a URI or a "
                                   "Hugging Face hub id", argument="base_model")
    if "://" in text:
        if text.startswith("file://"):
            return _check_model_dir(Path(text[len("file://"):]), text)
        return _check_model_dir(_fetch_uri(text, cache_root), text)
    path = Path(text).expanduser()
    if path.exists() or text.startswith((".", "/", "~")) or not _HUB_ID.match(text):
        if not path.exists():
            raise InvalidArgumentError(f"base model {text} does not exist (looked for "
                                       f"{path.resolve()})", argument="base_model")
        return _check_model_dir(path.resolve(), text)
    return _check_model_dir(_from_hub(text, hub_cache, offline), text)


def _check_model_dir(path: Path, given: str) -> Path:
    if not path.is_dir():
        raise InvalidArgumentError(f"base model {given} is not a directory ({path}); give the "
                                   "directory that save_pretrained() wrote",
                                   argument="base_model", path=str(path))
    if not (path / "config.json").is_file():
        found = sorted(p.name for p in path.iterdir())[:20]
        raise InvalidArgumentError(
            f"base model {given} has no config.json, so it is not a Hugging Face model "
            f"directory (it holds: {', '.join(found) or 'nothing'}); give the directory that "
            "save_pretrained() wrote", argument="base_model", path=str(path), found=found)
    return path


def _fetch_uri(uri: str, cache_root: Path) -> Path:
    from shoal.storage.artifacts import FsspecArtifactStore

    store = FsspecArtifactStore.open(uri.rstrip("/"))
    keys = [k for k in store.list_all() if k]
    if not keys:
        raise InvalidArgumentError(f"base model {uri} holds no files", argument="base_model")
    fingerprint = hashlib.sha256(json.dumps(keys).encode()).hexdigest()
    target = cache_root / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:24]
    mark = target / _CACHE_MARK
    if mark.is_file():
        try:
            if json.loads(mark.read_text()).get("fingerprint") == fingerprint:
                logger.info("base model %s: cached in %s", uri, target)
                return target
        except ValueError:
            pass
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_root))
    try:
        for key in keys:
            dest = tmp / key
            dest.parent.mkdir(parents=True, exist_ok=True)
            store.get_file(key, dest)
        (tmp / _CACHE_MARK).write_text(json.dumps({"uri": uri, "fingerprint": fingerprint}))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("base model %s: fetched %d file(s) into %s", uri, len(keys), target)
    return target


def _from_hub(repo_id: str, hub_cache: str | None, offline: bool | None) -> Path:
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as e:
        raise RuntimeEnvError("a hub model id needs huggingface_hub: pip install "
                              "'shoal[llm]'", module="huggingface_hub") from e
    cache = hub_cache or constants.HF_HUB_CACHE
    offline = constants.HF_HUB_OFFLINE if offline is None else offline
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=offline,
                                      ignore_patterns=_HUB_IGNORE))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        why = ("the hub is switched off here (HF_HUB_OFFLINE=1)" if offline else
               f"the hub could not be reached or refused it ({type(e).__name__}: {e})")
        raise ModelNotFound(
            f"base model {repo_id!r} is not in the Hugging Face cache {cache} and {why}. "
            "Download it where the hub is reachable (huggingface-cli download "
            f"{repo_id}), or pass a model directory or a URI as base_model",
            model=repo_id, cache=str(cache)) from e


# --- loading -------------------------------------------------------------------------------

def resolve_dtype(name: str, device: str) -> torch.dtype:
    """A torch dtype for an option value (``auto`` depends on the device)."""
    import torch

    if name == "auto":
        if device == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16,
            "float16": torch.float16}[name]


def check_bitsandbytes(device: str) -> types.ModuleType:
    """bitsandbytes, or a RuntimeEnvError that says why qlora cannot run and suggests lora."""
    try:
        import bitsandbytes
    except Exception as e:  # ImportError, or a native library that fails to load
        raise RuntimeEnvError(
            "method='qlora' loads the base model in 4 bits with bitsandbytes, which cannot be "
            f"loaded here ({type(e).__name__}: {e}). Install it (pip install 'shoal[llm]') or "
            "use method='lora', which trains the same adapters on a full-precision base",
            module="bitsandbytes", method="qlora") from e
    from packaging.version import Version

    have = Version(bitsandbytes.__version__)
    if device == "cpu" and have < Version("0.48"):
        raise RuntimeEnvError(
            f"method='qlora' on a CPU needs bitsandbytes >= 0.48 (4-bit CPU kernels); "
            f"bitsandbytes {have} is installed. Upgrade it, or use method='lora'",
            module="bitsandbytes", method="qlora")
    return bitsandbytes


def load_for_training(path: Path, opts: FineTuneOptions, device: str) -> Any:
    """The base model ready for adapters: quantized and prepared (qlora) or as it is (lora)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(opts.dtype, device)
    gc_kwargs = {"use_reentrant": False}
    if opts.method == FineTuneMethod.QLORA:
        check_bitsandbytes(device)
        from peft import prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig

        quant = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=opts.quant_type,
            bnb_4bit_use_double_quant=opts.double_quant, bnb_4bit_compute_dtype=dtype)
        device_map: Any = {"": torch.cuda.current_device()} if device == "cuda" else "cpu"
        try:
            model = AutoModelForCausalLM.from_pretrained(
                path, quantization_config=quant, device_map=device_map, dtype=dtype,
                trust_remote_code=opts.trust_remote_code)
        except (ImportError, RuntimeError) as e:
            raise RuntimeEnvError(
                f"method='qlora': bitsandbytes could not load {path} in 4 bits on {device} "
                f"({type(e).__name__}: {e}); use method='lora' to train the same adapters on "
                "a full-precision base", module="bitsandbytes", method="qlora") from e
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=opts.gradient_checkpointing,
            gradient_checkpointing_kwargs=gc_kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=opts.trust_remote_code)
        # transformers wraps .to() with functools.wraps: mypy misreads it as unbound
        model.to(device)  # type: ignore[arg-type]
        if opts.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs)
    model.config.use_cache = False  # no KV cache while training (and none with checkpointing)
    return model


# --- adapters ------------------------------------------------------------------------------

def linear_layer_names(model: Any) -> list[str]:
    """The distinct names of the model's linear layers (4-bit ones too), output head excluded."""
    import torch.nn as nn

    head = model.get_output_embeddings()
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and module is not head and name}
    return sorted(names)


def check_target_modules(model: Any, wanted: tuple[str, ...] | None) -> list[str]:
    """The layer names to adapt; each one asked for must match a layer of *model*."""
    linear = linear_layer_names(model)
    if wanted is None:
        if not linear:
            raise InvalidArgumentError(f"{type(model).__name__} has no linear layers to adapt "
                                       "besides its output head; give target_modules",
                                       argument="target_modules")
        return linear
    names = [n for n, _ in model.named_modules() if n]
    missing = [t for t in wanted if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise InvalidArgumentError(
            f"target_modules {', '.join(missing)} match no layer of {type(model).__name__}; "
            f"its linear layers are: {', '.join(linear)}", argument="target_modules",
            missing=missing, linear_layers=linear)
    return list(wanted)


def lora_config(opts: FineTuneOptions, targets: list[str]) -> LoraConfig:
    from peft import LoraConfig

    return LoraConfig(r=opts.r, lora_alpha=opts.lora_alpha, lora_dropout=opts.lora_dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")

