"""``shoal llm``: fine-tune language models from the command line.

``shoal llm finetune BASE_MODEL DATA`` runs the recipe as a training job (``FineTuner``) and
prints its ``model_data``; with ``--output-dir`` it runs here, in this process
(``finetune()``). Every recipe option is a flag generated from ``FineTuneOptions``, so the
three ways of fine-tuning take the same options with the same defaults.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from shoal.cli._context import out, state
from shoal.llm import FineTuneOptions

__all__ = ["app"]

app = typer.Typer(help="Fine-tune language models (LoRA / QLoRA).", no_args_is_help=True,
                  rich_markup_mode=None)

_RECIPE = "Recipe options"


def _flag_type(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = args[0] if args else hint
    if typing.get_origin(kind) is tuple:
        return list[str] | None
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return str | None
    return kind | None


def _recipe_parameters() -> list[inspect.Parameter]:
    hints = typing.get_type_hints(FineTuneOptions)
    defaults = FineTuneOptions()
    params = []
    for f in dataclasses.fields(FineTuneOptions):
        default = getattr(defaults, f.name)
        shown = default.value if isinstance(default, enum.Enum) else default
        flag = "--" + f.name.replace("_", "-")
        decls = [f"{flag}/--no-{f.name.replace('_', '-')}"] if hints[f.name] is bool else [flag]
        choices = f.metadata.get("choices")
        help_text = f.metadata["help"] + (f" ({', '.join(choices)})" if choices else "")
        option = typer.Option(*decls, help=f"{help_text} [default: {shown}]",
                              show_default=False, rich_help_panel=_RECIPE)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[_flag_type(hints[f.name]),
                                                             option]))
    return params


def _finetune(base_model: str, data: Path, validation_data: Path | None,
              output_dir: Path | None, checkpoint_dir: Path | None, instance_type: str | None,
              max_retry_attempts: int | None, experiment_name: str | None,
              run_name: str | None, **knobs: Any) -> None:
    given = {k: v for k, v in knobs.items() if v is not None}
    if "target_modules" in given:
        given["target_modules"] = tuple(given["target_modules"])
    options = FineTuneOptions.build(**given)
    import contextlib

    with contextlib.ExitStack() as stack:
        if state.home is not None:
            from shoal.session import use

            stack.enter_context(use(state.session()))
        if experiment_name:
            from shoal.experiments import Run

            stack.enter_context(Run(experiment_name=experiment_name, run_name=run_name))
        if output_dir is not None:
            _here(base_model, data, validation_data, output_dir, checkpoint_dir, options)
        else:
            _as_job(base_model, data, validation_data, checkpoint_dir, instance_type,
                    max_retry_attempts, options)


def _here(base_model: str, data: Path, validation_data: Path | None, output_dir: Path,
          checkpoint_dir: Path | None, options: FineTuneOptions) -> None:
    from shoal.llm import finetune

    result = finetune(base_model, data, output_dir=output_dir, validation_data=validation_data,
                      checkpoint_dir=checkpoint_dir, options=options)
    last = result.losses[-1][1] if result.losses else float("nan")
    out().print(Text(f"fine-tuned {base_model} ({result.method.value}) for "
                     f"{result.global_step} steps, last loss {last:.4f}, "
                     f"{result.tokens_per_second:.0f} tokens/s", style="bold green"))
    out().print(f"merged model: {result.model_dir}")
    out().print(f"adapter:      {result.adapter_dir}")


def _as_job(base_model: str, data: Path, validation_data: Path | None,
            checkpoint_dir: Path | None, instance_type: str | None,
            max_retry_attempts: int | None, options: FineTuneOptions) -> None:
    from shoal.llm import FineTuner

    extra: dict[str, Any] = {}
    if checkpoint_dir is not None:
        extra["checkpoint_s3_uri"] = Path(checkpoint_dir).resolve().as_uri()
    tuner = FineTuner(base_model, options=options, method=options.method.value,
                      instance_type=instance_type, max_retry_attempts=max_retry_attempts,
                      **extra)
    inputs = {"training": str(data)}
    if validation_data is not None:
        inputs["validation"] = str(validation_data)
    tuner.fit(inputs)
    job = tuner.latest_training_job
    out().print(Text(f"job {job.name if job else '?'} completed", style="bold green"))
    out().print(f"model_data: {tuner.model_data}")


def finetune_command(**kwargs: Any) -> None:
    """Fine-tune BASE_MODEL on DATA with LoRA or QLoRA; save the merged model.

    BASE_MODEL is a model directory, a URI (s3://...) or a Hugging Face hub id. DATA is a
    JSONL file, a folder of them, or a datasets directory (save_to_disk). Without
    --output-dir the recipe runs as a training job; with it, here.
    """
    _finetune(**kwargs)


_COMMON = [
    inspect.Parameter("base_model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[
        str, typer.Argument(help="model directory, URI or hub id")]),
    inspect.Parameter("data", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[
        Path, typer.Argument(help="training data: JSONL file/folder or datasets directory")]),
    inspect.Parameter("validation_data", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[Path | None, typer.Option(
                          "--validation-data", help="validation data (same formats)")]),
    inspect.Parameter("output_dir", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[Path | None, typer.Option(
                          "--output-dir", help="run here and write the merged model to this "
                          "directory (default: run as a training job)")]),
    inspect.Parameter("checkpoint_dir", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[Path | None, typer.Option(
                          "--checkpoint-dir", help="checkpoints; a rerun with the same "
                          "directory resumes")]),
    inspect.Parameter("instance_type", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[str | None, typer.Option(
                          "--instance-type", help="the job's instance type (e.g. "
                          "ml.g5.2xlarge)")]),
    inspect.Parameter("max_retry_attempts", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[int | None, typer.Option(
                          "--max-retry-attempts", help="attempts of the job")]),
    inspect.Parameter("experiment_name", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[str | None, typer.Option(
                          "--experiment-name", help="log loss and learning rate to a run of "
                          "this experiment")]),
    inspect.Parameter("run_name", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[str | None, typer.Option(
                          "--run-name", help="the run's name (generated if omitted)")]),
]

_FINETUNE_SIGNATURE = inspect.Signature([*_COMMON, *_recipe_parameters()])
# typer reads the options from the signature: the function itself takes **kwargs.
finetune_command.__signature__ = _FINETUNE_SIGNATURE  # type: ignore[attr-defined]
finetune_command.__annotations__ = {p.name: p.annotation
                                    for p in _FINETUNE_SIGNATURE.parameters.values()}
app.command("finetune")(finetune_command)
