"""The graphs a run logged (``log_confusion_matrix``, ``log_roc_curve``,
``log_precision_recall``: JSON artifacts in SageMaker's shapes) as a run page draws them:
curves as chart series, a confusion matrix as table cells with a shade bucket each."""

from __future__ import annotations

import json
from typing import Any

from shoal.core.experiments import RunArtifact
from shoal.core.ports import ArtifactStore
from shoal.errors import ArtifactNotFound, InvalidArgumentError

__all__ = ["CURVES", "GRAPHS", "curve_series", "load_graph", "matrix_rows"]

#: Graph type -> (x field, y field, x label, y label, the summary field and its name).
CURVES = {
    "ROCCurve": ("falsePositiveRate", "truePositiveRate", "false positive rate",
                 "true positive rate", "areaUnderCurve", "AUC"),
    "PrecisionRecallCurve": ("recall", "precision", "recall", "precision",
                             "averagePrecisionScore", "AP"),
}
GRAPHS = frozenset({*CURVES, "ConfusionMatrix"})
_SHADES = 10


def load_graph(artifacts: ArtifactStore, artifact: RunArtifact) -> dict[str, Any]:
    """The graph's JSON, read from the console's artifact store (where ``Run`` put it)."""
    root = artifacts.uri("").rstrip("/") + "/"
    if not artifact.value.startswith(root):
        raise InvalidArgumentError(
            f"graph {artifact.name!r} is stored at {artifact.value}, outside this console's "
            f"artifact store ({root}); read it with load_run(...)", artifact=artifact.name)
    try:
        data = json.loads(artifacts.get_bytes(artifact.value.removeprefix(root)))
    except ArtifactNotFound:
        raise
    except ValueError as e:
        raise InvalidArgumentError(f"graph {artifact.name!r} ({artifact.value}) is not JSON: "
                                   f"{e}", artifact=artifact.name) from e
    if not isinstance(data, dict) or data.get("type") not in GRAPHS:
        raise InvalidArgumentError(f"graph {artifact.name!r} is not one of "
                                   f"{', '.join(sorted(GRAPHS))}", artifact=artifact.name)
    return data


def curve_series(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """A ROC or precision-recall curve as one chart series (x ascending, as uPlot needs)."""
    x_field, y_field, x_label, y_label, score, score_name = CURVES[str(data["type"])]
    pairs = sorted(zip((float(v) for v in data[x_field]), (float(v) for v in data[y_field]),
                       strict=True))
    label = name if data.get(score) is None else f"{name} ({score_name} {data[score]:.3f})"
    return {"name": label, "x_label": x_label, "y_label": y_label, "x_is_step": True,
            "points": len(pairs), "x": [x for x, _ in pairs], "y": [y for _, y in pairs]}


def matrix_rows(data: dict[str, Any]) -> list[list[tuple[int, int]]]:
    """The confusion matrix's cells as (count, shade 0-9 of the largest count) per row."""
    rows = [[int(v) for v in row] for row in data["confusionMatrix"]]
    top = max((v for row in rows for v in row), default=0) or 1
    return [[(v, min(_SHADES - 1, v * _SHADES // top)) for v in row] for row in rows]
