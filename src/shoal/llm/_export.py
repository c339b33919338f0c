"""After training: merge the adapter into a full- or half-precision base, save the merged model
(safetensors) with its tokenizer, the adapter alone, and a ``serving.properties``.

Layout of the output directory (a job's ``SM_MODEL_DIR``, so all of it is in model.tar.gz)::

    config.json, model*.safetensors, tokenizer*, generation_config.json   the merged model
    adapter/                     adapter_config.json + adapter_model.safetensors
    serving.properties           DJL: engine=Python, option.model_id, option.dtype, ...
    shoal-finetune.json          what was trained, from what, with which options and results

A merged model larger than ``large_model_threshold_mb``, in a job, is uploaded uncompressed
under the job's ``output/model/`` prefix with a ``manifest.json``; the directory then keeps
the adapter, the manifest, serving.properties (pointing at the prefix) and the summary. A
prefix below the session's own artifact store goes through that store (through a team server:
over HTTP with the job's token, as the job's other files), any other is opened on its URL.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from shoal.llm._base import resolve_dtype
from shoal.llm._options import FineTuneOptions
from shoal.llm._serving import DJL_DTYPES, write_serving_properties

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from shoal.core.ports import ArtifactStore

__all__ = ["MANIFEST", "SUMMARY", "merge_and_save", "store_for", "store_large_model"]

logger = logging.getLogger(__name__)

SUMMARY = "shoal-finetune.json"
MANIFEST = "manifest.json"
#: Where SageMaker (and DJL) unpack model.tar.gz: the merged model sits at its root.
_SM_MODEL_PATH = "/opt/ml/model"
_KEEP = {"adapter", "serving.properties", SUMMARY, MANIFEST}


class ManifestFile(TypedDict):
    path: str
    size: int
    sha256: str


class Manifest(TypedDict):
    """``manifest.json`` of a merged model stored under a prefix."""

    format: str
    uri: str
    files: list[ManifestFile]
    total_bytes: int


def merge_and_save(*, base_path: Path, adapter_dir: Path, output_dir: Path,
                   tokenizer: PreTrainedTokenizerBase, opts: FineTuneOptions, device: str
                   ) -> str:
    """Merge *adapter_dir* into the base and save it in *output_dir*; the merged dtype name."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(opts.merge_dtype, device)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype,
                                                trust_remote_code=opts.trust_remote_code)
    if device == "cuda":
        # transformers wraps .to() with functools.wraps: mypy misreads it as unbound
        base.to("cuda")  # type: ignore[arg-type]
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.config.use_cache = True
    merged.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    del merged, base
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    name = str(dtype).removeprefix("torch.")
    props = serving_properties(opts, name, _SM_MODEL_PATH)
    limit = _max_positions(output_dir)
    if limit is not None and int(str(props["option.max_model_len"])) > limit:
        props["option.max_model_len"] = limit  # what the model can attend to, at most
    write_serving_properties(output_dir, props)
    return name


def _max_positions(model_dir: Path) -> int | None:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


def serving_properties(opts: FineTuneOptions, dtype: str, model_id: str) -> dict[str, object]:
    return {
        "engine": "Python",
        "option.model_id": model_id,
        "option.dtype": DJL_DTYPES.get(dtype, dtype),
        "option.rolling_batch": opts.rolling_batch,
        "option.max_model_len": opts.max_model_len or opts.max_seq_length,
        "option.trust_remote_code": opts.trust_remote_code,
    }


def model_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.safetensors") if p.is_file())


def store_large_model(output_dir: Path, prefix_uri: str, opts: FineTuneOptions,
                      dtype: str) -> Manifest:
    """Upload the merged model under *prefix_uri*; leave a manifest in *output_dir*."""
    from shoal.session import current

    store, below = store_for(prefix_uri, current().artifacts)
    files: list[ManifestFile] = []
    for path in sorted(p for p in output_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(output_dir).as_posix()
        if rel.split("/", 1)[0] in _KEEP:
            continue
        store.put_file(below + rel, path)
        files.append({"path": rel, "size": path.stat().st_size, "sha256": _sha256(path)})
    manifest: Manifest = {"format": "shoal-model-manifest/1", "uri": prefix_uri.rstrip("/"),
                          "files": files, "total_bytes": sum(f["size"] for f in files)}
    body = json.dumps(manifest, indent=2).encode()
    store.put_bytes(below + MANIFEST, body)  # last: a prefix with a manifest is complete
    (output_dir / MANIFEST).write_bytes(body)
    for f in files:
        (output_dir / f["path"]).unlink()
    write_serving_properties(output_dir, serving_properties(opts, dtype, manifest["uri"]))
    logger.info("merged model (%.1f MB) stored under %s", manifest["total_bytes"] / 1e6,
                manifest["uri"])
    return manifest


def store_for(prefix_uri: str, own: ArtifactStore) -> tuple[ArtifactStore, str]:
    """The store that holds *prefix_uri* and the key prefix (``""`` or ending in ``/``) of
    the URI in it: *own* (the session's store) when the URI lies below its root, else a store
    opened on the URI itself."""
    prefix = prefix_uri.rstrip("/")
    root = str(own.root).rstrip("/") + "/"
    if prefix.startswith(root):
        return own, prefix[len(root):] + "/"
    from shoal.storage.artifacts import FsspecArtifactStore

    return FsspecArtifactStore.open(prefix), ""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
