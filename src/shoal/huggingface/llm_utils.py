"""At SageMaker's path ``sagemaker.huggingface.llm_utils``: the LLM serving image URI.

``get_huggingface_llm_image_uri("huggingface", version="2.0")`` names TGI's container on
SageMaker; here it returns shoal's URI for it (``shoal.local/huggingface-llm:2.0``), which
``HuggingFaceModel(image_uri=...)`` accepts: the model is served by shoal's LLM server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.errors import InvalidArgumentError
from shoal.image_uris import retrieve

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["get_huggingface_llm_image_uri"]

_BACKENDS = {"huggingface": "huggingface-llm", "lmi": "djl-lmi",
             "huggingface-neuronx": "huggingface-llm", "huggingface-tei": "huggingface-tei",
             "huggingface-tei-cpu": "huggingface-tei"}


def get_huggingface_llm_image_uri(backend: str, session: Session | None = None,
                                  region: str | None = None, version: str | None = None
                                  ) -> str:
    """shoal's URI for the LLM container SageMaker's *backend* names."""
    framework = _BACKENDS.get(backend)
    if framework is None:
        raise InvalidArgumentError(f"backend {backend!r} is not one of "
                                   f"{', '.join(sorted(_BACKENDS))}", argument="backend")
    return retrieve(framework, region, version=version, image_scope="inference")
