"""DJL LMI's vocabulary, and what each word means here: the built-in ``djl_python.*``
handlers an ``option.entryPoint`` may name, the ``engine`` and ``option.rolling_batch``
values, and the keys shoal accepts without acting on them (AWS Neuron's compiler settings,
DJL's worker settings).

Everything LMI names runs on shoal's engine: the transformers engine with continuous
batching (vLLM's engine for the vLLM handler and ``option.rolling_batch=vllm`` when the
``vllm`` package is installed). ``LmiNotes`` are the sentences the server says once at start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.llm.serving._properties import LlmServingOptions

__all__ = ["ASYNC_HANDLERS", "BUILTIN_HANDLERS", "NEURON_KEYS", "NO_EFFECT_KEYS",
           "NON_LLM_HANDLERS", "VLLM_HANDLERS", "KeptKey", "builtin_handler", "kept_reason", "lmi_notes"]

#: ``option.entryPoint`` names of DJL's built-in LLM handlers -> what DJL would run.
BUILTIN_HANDLERS: dict[str, str] = {
    "djl_python.huggingface": "Hugging Face Accelerate (or vLLM / lmi-dist by rolling_batch)",
    "djl_python.transformers_neuronx": "Transformers NeuronX on AWS Inferentia/Trainium",
    "djl_python.transformers-neuronx": "Transformers NeuronX on AWS Inferentia/Trainium",
    "djl_python.deepspeed": "DeepSpeed inference",
    "djl_python.fastertransformer": "FasterTransformer",
    "djl_python.lmi_dist": "lmi-dist",
    "djl_python.tensorrt_llm": "TensorRT-LLM",
    "djl_python.tensorrt_llm_python": "TensorRT-LLM (Python backend)",
    "djl_python.lmi_trtllm.trtllm_async_service": "TensorRT-LLM (async service)",
    "djl_python.vllm": "vLLM",
    "djl_python.lmi_vllm.vllm_async_service": "vLLM (async service)",
}
#: the handlers that ask for vLLM (served by vLLM's engine when it is installed)
VLLM_HANDLERS = frozenset({"djl_python.vllm", "djl_python.lmi_vllm.vllm_async_service"})
#: the async services batch on their own: LMI pairs them with option.rolling_batch=disable
ASYNC_HANDLERS = frozenset({"djl_python.lmi_vllm.vllm_async_service",
                            "djl_python.lmi_trtllm.trtllm_async_service"})
#: DJL's built-in handlers that serve something other than a text-generation LLM
NON_LLM_HANDLERS: dict[str, str] = {
    "djl_python.stable-diffusion": "Stable Diffusion (images)",
    "djl_python.stable_diffusion_inf2": "Stable Diffusion on Inferentia 2 (images)",
    "djl_python.sklearn_handler": "scikit-learn models",
    "djl_python.xgboost_handler": "XGBoost models",
}

#: Transformers NeuronX / Optimum Neuron settings: the compiler's, kept and reported once.
NEURON_KEYS = frozenset({
    "option.neuron_optimize_level", "option.unroll", "option.load_split_model",
    "option.context_length_estimate", "option.amp", "option.compiled_graph_path",
    "option.group_query_attention", "option.fuse_qkv", "option.attention_layout",
    "option.collectives_layout", "option.cache_layout", "option.partition_schema",
    "option.on_device_embedding", "option.on_device_generation",
    "option.shard_over_sequence", "option.sequence_parallel_norm",
    "option.enable_saturate_infinity", "option.enable_mixed_precision_accumulation",
    "option.neuron_quant", "option.rolling_batch_strategy",
    "option.draft_model_compiled_path",
})

#: DJL / LMI keys accepted with no effect here -> why (lower-cased keys).
NO_EFFECT_KEYS: dict[str, str] = {
    "option.revision": "models are read offline: a directory, a URI or the local cache",
    "option.parallel_loading": "one model copy is loaded",
    "option.enable_streaming": "every API streams on request, with \"stream\": true",
    "option.predict_timeout": "requests run until done or the client leaves",
    "option.pythonexecutable": "the server's own interpreter runs the model",
    "option.enable_venv": "the server's own environment runs the model",
    "option.device_map": "the engine places the model by option.tensor_parallel_degree",
    "option.low_cpu_mem_usage": "transformers loads weights lazily already",
    "option.task": "text generation is the task served",
    "option.output_formatter": "the API's own response shape is written",
    "option.mpi_mode": "one process serves",
    "option.async_mode": "the server is asynchronous already",
    "option.max_input_len": "option.max_model_len bounds prompt + generated tokens",
    "option.max_output_len": "option.max_model_len bounds prompt + generated tokens",
    "option.max_rolling_batch_prefill_tokens": "prompts are prefilled as they arrive",
    "option.gpu_memory_utilization": "the KV cache grows with the batch",
    "option.enforce_eager": "the transformers engine runs eagerly",
    "option.waiting_steps": "requests join the batch at every step",
    "option.save_mp_checkpoint_path": "no partitioned checkpoint is written",
    "minworkers": "one worker process serves; its engine batches",
    "maxworkers": "one worker process serves; its engine batches",
    "batch_size": "continuous batching admits requests at every step; "
                  "option.max_rolling_batch_size or option.batch_size sets the limit",
    "max_batch_delay": "continuous batching admits requests at every step",
    "max_idle_time": "continuous batching admits requests at every step",
    "load_on_devices": "the engine places the model by option.tensor_parallel_degree",
    "required_memory_mb": "no memory reservation is made",
    "reserved_memory_mb": "no memory reservation is made",
}


def builtin_handler(value: str) -> str | None:
    """The built-in handler *value* names (as DJL spells it), or None for a file name."""
    name = value.strip()
    if name.lower().endswith(".py") or "/" in name:
        return None
    for known in (*BUILTIN_HANDLERS, *NON_LLM_HANDLERS):
        if name.lower() == known.lower():
            return known
    return name if name.lower().startswith("djl_python.") else None


def kept_reason(lower_key: str) -> str | None:
    """Why *lower_key* (a DJL/LMI key shoal knows but does not act on) has no effect here."""
    if lower_key in NEURON_KEYS:
        return "AWS Neuron compiler settings; no Neuron devices here"
    return NO_EFFECT_KEYS.get(lower_key)


@dataclass(frozen=True, slots=True)
class KeptKey:
    """A key accepted with no effect: as written, its value, and why."""

    key: str
    value: str
    reason: str


#: option.rolling_batch -> the library DJL would batch with
_LIBRARIES = {"auto": "the container's default library", "vllm": "vLLM", "lmi-dist": "lmi-dist",
              "lmi-dist-v2": "lmi-dist", "scheduler": "DJL's scheduler",
              "deepspeed": "DeepSpeed", "trtllm": "TensorRT-LLM", "tensorrtllm": "TensorRT-LLM",
              "tnx": "Transformers NeuronX"}


def lmi_notes(options: LlmServingOptions, source: Path) -> list[tuple[int, str]]:
    """What the server says once at start, with a log level: which engine serves the file
    (and what DJL would have run), the keys kept with no effect, the unknown keys."""
    notes: list[tuple[int, str]] = []
    if options.entry_point:
        passed = sorted(k for k in options.unknown if k.lower().startswith("option."))
        if passed:
            notes.append((logging.INFO, f"{source}: passing {', '.join(passed)} to "
                                        f"option.entryPoint's handler"))
    else:
        notes.append((logging.INFO, _engine_sentence(options, source)))
    by_reason: dict[str, list[str]] = {}
    for kept in options.kept:
        by_reason.setdefault(kept.reason, []).append(f"{kept.key}={kept.value}")
    for reason, keys in by_reason.items():
        notes.append((logging.WARNING, f"{source}: kept with no effect here: "
                                       f"{', '.join(keys)} ({reason})"))
    if options.ignored:
        notes.append((logging.WARNING, f"{source}: ignoring key(s) this server does not "
                                       f"know: {', '.join(options.ignored)} (the README's LLM "
                                       f"section lists the keys it reads)"))
    return notes


def _engine_sentence(options: LlmServingOptions, source: Path) -> str:
    written = {k.lower(): (k, v) for k, v in options.properties.items()}
    asked = [f"{k}={v}" for lower in ("engine", "option.entrypoint", "option.rolling_batch")
             if lower in written for k, v in [written[lower]]]
    if options.requires_vllm:
        engine = "vLLM's engine"
    elif options.wants_vllm:
        engine = ("vLLM's engine if the vllm package is installed, else shoal's transformers "
                  "engine")
    else:
        engine = "shoal's transformers engine"
    limit = options.batch_size
    batching = (f"continuous batching of up to {limit} sequences" if limit > 1
                else "one request at a time")
    if options.handler in ASYNC_HANDLERS and options.rolling_batch.value == "disable":
        batching += " (the async service batches on its own, as LMI pairs it with " \
                    "option.rolling_batch=disable)"
    instead = ""
    if options.handler is not None:
        instead = f"; in DJL: {BUILTIN_HANDLERS[options.handler]}"
    elif options.rolling_batch.value in _LIBRARIES and options.engine.value not in (
            "transformers", "vllm"):
        instead = f"; in DJL: {_LIBRARIES[options.rolling_batch.value]}"
    return (f"{source} ({', '.join(asked) or 'the defaults'}): served by {engine}, "
            f"{batching}{instead}")
