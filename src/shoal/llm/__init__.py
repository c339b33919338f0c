"""LLMs: LoRA/QLoRA fine-tuning recipes, the LLM server runtime (``shoal.llm.serving``) and
SageMaker's LLM model classes (``HuggingFaceModel``, ``DJLModel``, at ``shoal.huggingface`` and
``shoal.djl_inference``).

- ``finetune(base_model, train_data, output_dir=..., method="qlora", ...)``: the recipe, in
  this process (or inside ``@remote``);
- ``FineTuner(base_model=..., method="qlora", ...).fit({"training": uri})``: the same recipe as
  a script-mode training job; ``model_data`` is the merged model;
- ``shoal llm finetune`` on the command line.

SageMaker's LLM classes are here too, as their SageMaker paths re-export them:
``HuggingFaceModel``/``HuggingFacePredictor`` and the ``HuggingFace`` estimator whose
``deploy()`` makes one (``shoal.huggingface``), ``DJLModel``/``DJLPredictor``
(``shoal.djl_inference``). ``CHAT_TEMPLATE`` is the chat template a recipe gives a tokenizer
that has none (saved with the merged model).

Every option is a field of ``FineTuneOptions``. torch, transformers and peft load only when a
recipe runs, so importing this package stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal._internal.lazy import lazy_exports

if TYPE_CHECKING:
    from shoal.llm._data import CHAT_TEMPLATE
    from shoal.llm._estimator import FineTuner
    from shoal.llm._huggingface import HuggingFace
    from shoal.llm._options import DataFormat, FineTuneMethod, FineTuneOptions
    from shoal.llm._recipe import FineTuneResult, finetune
    from shoal.llm._sagemaker_models import (
        DJLModel,
        DJLPredictor,
        HuggingFaceModel,
        HuggingFacePredictor,
    )
    from shoal.llm._serving import read_serving_properties, write_serving_properties
    from shoal.llm._tiny import create_tiny_model

__all__ = ["CHAT_TEMPLATE", "DJLModel", "DJLPredictor", "DataFormat", "FineTuneMethod",
           "FineTuneOptions", "FineTuneResult", "FineTuner", "HuggingFace", "HuggingFaceModel",
           "HuggingFacePredictor", "create_tiny_model", "finetune", "read_serving_properties",
           "write_serving_properties"]

_LAZY = {
    "CHAT_TEMPLATE": "shoal.llm._data",
    "FineTuner": "shoal.llm._estimator",
    "HuggingFace": "shoal.llm._huggingface",
    "DataFormat": "shoal.llm._options",
    "FineTuneMethod": "shoal.llm._options",
    "FineTuneOptions": "shoal.llm._options",
    "FineTuneResult": "shoal.llm._recipe",
    "finetune": "shoal.llm._recipe",
    "DJLModel": "shoal.llm._sagemaker_models",
    "DJLPredictor": "shoal.llm._sagemaker_models",
    "HuggingFaceModel": "shoal.llm._sagemaker_models",
    "HuggingFacePredictor": "shoal.llm._sagemaker_models",
    "read_serving_properties": "shoal.llm._serving",
    "write_serving_properties": "shoal.llm._serving",
    "create_tiny_model": "shoal.llm._tiny",
}


__getattr__, __dir__ = lazy_exports("shoal.llm", _LAZY, globals(), __all__)
