"""Hub ids in the local Hugging Face cache (offline: there is no network to download from).

Shared by the LLM server's model lookup (``llm/serving/_properties.py``) and by
``HuggingFaceModel``/``DJLModel`` (``llm/_sagemaker_models.py``), which check a ``model_id``
before deploying it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["from_hub_cache", "looks_like_hub_id"]


def looks_like_hub_id(model_id: str) -> bool:
    """Whether *model_id* has a hub id's shape (``name`` or ``org/name``)."""
    parts = model_id.split("/")
    return 1 <= len(parts) <= 2 and all(parts) and not model_id.startswith((".", "~"))


def from_hub_cache(repo_id: str) -> tuple[Path | None, str]:
    """The snapshot directory of *repo_id* in the local cache (``None`` when it is not there)
    and where that was looked for, in words."""
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        return None, "the Hugging Face cache (huggingface_hub is not installed)"
    where = f"the Hugging Face cache {constants.HF_HUB_CACHE} (offline)"
    try:
        return Path(snapshot_download(repo_id, local_files_only=True)), where
    except Exception:  # any hub error means "not in the cache"
        return None, where
