"""``FineTuner``: the fine-tuning recipe as a script-mode training job.

It is an ``Estimator`` whose entry script is shoal's own (``recipes/finetune.py``) and whose
hyperparameters are the recipe's options, so channels, logs, metrics, checkpoints (restored
on a retry), instance types and experiment runs all work as for any training job.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal._internal.extras import require
from shoal.core.jobs import JobSpec, RunRef
from shoal.errors import InvalidArgumentError
from shoal.llm._options import FineTuneOptions
from shoal.training import Estimator

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["METRIC_DEFINITIONS", "FineTuner"]

_ENTRY = Path(__file__).resolve().parent / "recipes" / "finetune.py"
_NUMBER = r"([0-9.eE+\-]+)"
#: What the recipe prints each logging step, as SageMaker metric definitions.
METRIC_DEFINITIONS = (
    {"Name": "train:loss", "Regex": rf"\bloss={_NUMBER} "},
    {"Name": "train:learning_rate", "Regex": rf"\blearning_rate={_NUMBER} "},
    {"Name": "validation:loss", "Regex": rf"\beval_loss={_NUMBER} "},
)
_OURS = ("entry_point", "source_dir", "hyperparameters", "dependencies")


class FineTuner(Estimator):
    """LoRA/QLoRA fine-tuning of *base_model* as a training job; ``model_data`` is the merged
    model (with ``adapter/`` and ``serving.properties``).

    Keyword arguments that are ``FineTuneOptions`` fields (``r``, ``max_steps``,
    ``learning_rate``...) are the recipe's options; the others are ``Estimator``'s.

    Example:
        >>> from shoal.llm import FineTuner                              # doctest: +SKIP
        >>> tuner = FineTuner(base_model="s3://models/llama-3-8b", method="qlora",
        ...                   instance_type="ml.g5.2xlarge", max_steps=500)
        >>> tuner.fit({"training": "s3://data/dolly.jsonl"})            # doctest: +SKIP
        >>> tuner.model_data                                             # doctest: +SKIP
    """

    def __init__(self, base_model: str, method: str = "qlora", *,
                 options: FineTuneOptions | None = None, **kwargs: Any) -> None:
        taken = sorted(set(_OURS) & set(kwargs))
        if taken:
            raise InvalidArgumentError(f"FineTuner sets {', '.join(taken)} itself (it runs "
                                       "shoal's recipe script); pass recipe options as keyword "
                                       "arguments", arguments=taken)
        if not kwargs.get("dependencies"):  # the job runs in this environment: it needs them
            require("llm", "FineTuner", "torch", "transformers", "peft")
        knobs = {k: kwargs.pop(k) for k in list(kwargs) if k in FineTuneOptions.names()}
        self.options = FineTuneOptions.build(options, method=method, **knobs)
        self.base_model = _check_base_model(base_model)
        #: Through a team server: where this fit's upload of a local base model is.
        self._shipped_base_model: str | None = None
        hyperparameters: dict[str, Any] = {"base_model": self.base_model,
                                           "method": self.options.method.value,
                                           **self.options.changed()}
        if kwargs.get("checkpoint_local_path"):
            hyperparameters["checkpoint_dir"] = kwargs["checkpoint_local_path"]
        kwargs.setdefault("base_job_name", "llm-finetune")
        kwargs.setdefault("metric_definitions", [dict(d) for d in METRIC_DEFINITIONS])
        super().__init__(entry_point=str(_ENTRY), hyperparameters=hyperparameters, **kwargs)

    def _spec(self, name: str, channels: dict[str, Any], session: Session,
              run: RunRef | None, requirements: str | None) -> JobSpec:
        if "training" not in channels:
            raise InvalidArgumentError(
                f"FineTuner.fit needs a 'training' channel (got {', '.join(channels) or 'none'})"
                ": fit({'training': 'data/train.jsonl'})", argument="inputs")
        # where a merged model too large for model.tar.gz goes: beside it, uncompressed
        self.hyperparameters_["model_prefix_uri"] = self._model_prefix(name)
        remote = session.settings.server_url is not None
        self.hyperparameters_["base_model"] = (self._shipped_base_model if remote else None) \
            or self.base_model
        return super()._spec(name, channels, session, run, requirements)

    def _client_files(self, name: str, channels: dict[str, Any],
                      session: Session) -> dict[str, Path]:
        """The channels' local data and, for a local base model, its directory (under
        ``<job>/input/base_model/``: the job reads it from the server's store)."""
        files = super()._client_files(name, channels, session)
        self._shipped_base_model = None
        if "://" not in self.base_model and Path(self.base_model).is_absolute():
            self._shipped_base_model, more = self._ship_path(
                name, Path(self.base_model), "input/base_model",
                f"base_model {self.base_model!r}", session)
            files.update(more)
        return files

    def _model_prefix(self, job_name: str) -> str:
        return f"{str(self._output_root).rstrip('/')}/{job_name}/output/model"

    @property
    def model_data(self) -> str:
        """The merged model: ``.../output/model.tar.gz``, or the ``.../output/model/`` prefix
        (with its ``manifest.json``) when it was above ``large_model_threshold_mb``."""
        tarball = super().model_data
        from shoal.llm._export import MANIFEST, store_for

        prefix = self._model_prefix(self._require_job().name)
        # through the session's store where the prefix is in it (a team server's: over HTTP)
        store, below = store_for(prefix, self.sagemaker_session.artifacts)
        if store.exists(below + MANIFEST):
            return prefix + "/"
        return tarball

    def __repr__(self) -> str:
        return (f"FineTuner(base_model={self.base_model!r}, method="
                f"{self.options.method.value!r}, instance_type={self.instance_type!r})")


def _check_base_model(base_model: Any) -> str:
    """Local directories become absolute paths (checked now); URIs and hub ids pass as given."""
    if not isinstance(base_model, str) or not base_model:
        raise InvalidArgumentError("base_model must be a model directory, a URI or a hub id",
                                   argument="base_model")
    if "://" in base_model:
        return base_model
    path = Path(base_model).expanduser()
    if path.exists() or base_model.startswith((".", "/", "~")):
        from shoal.llm._base import resolve_base_model

        return str(resolve_base_model(str(path.resolve()), cache_root=Path("/nonexistent")))
    return base_model

