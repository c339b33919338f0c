"""Inside a ``FineTuner`` job: hyperparameters (``--key value``) and the container layout
(``/opt/ml``: channels, model dir, checkpoints) turned into one ``finetune()`` call.

A ``ShoalError`` (bad data, a missing model...) is written to ``output/failure``, which
becomes the job's failure reason, and the script exits 1.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from shoal.errors import InvalidArgumentError, ShoalError

__all__ = ["main", "parse_hyperparameters"]

#: Hyperparameters of the job that are not FineTuneOptions fields.
JOB_KEYS = ("base_model", "checkpoint_dir", "model_prefix_uri")
_OPT_ML = "/opt/ml"


def parse_hyperparameters(argv: Sequence[str]) -> dict[str, str]:
    """``--key value`` pairs (as the training toolkit passes them) to a dict."""
    out: dict[str, str] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        key = args[i]
        if not key.startswith("--") or i + 1 >= len(args):
            raise InvalidArgumentError(f"expected --key value arguments, got {args[i:]!r}")
        out[key[2:].replace("-", "_")] = args[i + 1]
        i += 2
    return out


def _inside(opt_ml: Path, sm_path: str) -> Path:
    if sm_path == _OPT_ML or sm_path.startswith(_OPT_ML + "/"):
        return opt_ml / sm_path[len(_OPT_ML):].lstrip("/")
    return Path(sm_path)


def main(argv: Sequence[str], opt_ml: Path) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stdout)
    # bitsandbytes warns at import when an optional CPU kernel package is absent
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    try:
        from shoal.llm._options import FineTuneOptions
        from shoal.llm._recipe import finetune

        hps = parse_hyperparameters(argv)
        job = {k: hps.pop(k) for k in JOB_KEYS if k in hps}
        if "base_model" not in job:
            raise InvalidArgumentError("the job has no base_model hyperparameter")
        options = FineTuneOptions.from_strings(hps)
        data = opt_ml / "input" / "data"
        if not (data / "training").exists():
            raise InvalidArgumentError("the job has no 'training' channel: fit({'training': "
                                       "uri}) gives it the data")
        validation = data / "validation"
        result = finetune(
            job["base_model"], data / "training", output_dir=opt_ml / "model",
            validation_data=validation if validation.exists() else None,
            checkpoint_dir=_inside(opt_ml, job.get("checkpoint_dir") or "/opt/ml/checkpoints"),
            model_prefix_uri=job.get("model_prefix_uri"), options=options)
    except ShoalError as e:
        failure = opt_ml / "output" / "failure"
        failure.parent.mkdir(parents=True, exist_ok=True)
        failure.write_text(f"{type(e).__name__}: {e}")
        traceback.print_exc()
        return 1
    sys.stdout.write(f"fine-tuning done: {result.global_step} steps, merged model "
                     f"{result.model_uri or 'in model.tar.gz'}\n")
    return 0
