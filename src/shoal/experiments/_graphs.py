"""The graphs ``Run`` logs (confusion matrix, precision-recall and ROC curves), computed with
numpy into SageMaker's JSON artifact shapes; scikit-learn is not needed.

The curves follow scikit-learn's definitions (``precision_recall_curve``,
``average_precision_score``, ``roc_curve`` with ``drop_intermediate=True``), so values match
what SageMaker's SDK logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shoal._internal.extras import require
from shoal.errors import InvalidArgumentError

__all__ = ["confusion_matrix", "precision_recall", "roc_curve"]


def _np() -> Any:
    require("experiments", "logging a graph", "numpy")
    import numpy

    return numpy


def _pair(y_true: Sequence[Any], predicted: Sequence[Any], what: str) -> tuple[Any, Any]:
    np = _np()
    t, p = np.asarray(y_true), np.asarray(predicted)
    if t.ndim != 1 or p.ndim != 1:
        raise InvalidArgumentError(f"y_true and the {what} must be one-dimensional, got shapes "
                                   f"{t.shape} and {p.shape}")
    if len(t) != len(p):
        raise InvalidArgumentError(f"y_true has {len(t)} values but the {what} have {len(p)}; "
                                   "they must be the same length")
    if len(t) == 0:
        raise InvalidArgumentError(f"y_true and the {what} are empty")
    return t, p


def confusion_matrix(y_true: Sequence[Any], y_pred: Sequence[Any],
                     title: str | None) -> dict[str, Any]:
    """Rows are true labels, columns predicted labels, both in sorted label order."""
    np = _np()
    t, p = _pair(y_true, y_pred, "predicted labels")
    labels = np.unique(np.concatenate([t, p]))
    matrix = np.zeros((len(labels), len(labels)), dtype=np.int64)
    np.add.at(matrix, (np.searchsorted(labels, t), np.searchsorted(labels, p)), 1)
    return {"type": "ConfusionMatrix", "version": 0, "title": title,
            "confusionMatrix": matrix.tolist()}


def _binary(y_true: Any, positive_label: Any) -> Any:
    np = _np()
    labels = np.unique(y_true)
    if positive_label is None:
        known = {0, 1} if set(labels.tolist()) <= {0, 1} else \
            {-1, 1} if set(labels.tolist()) <= {-1, 1} else None
        if known is None:
            raise InvalidArgumentError(
                f"y_true has the labels {labels.tolist()[:10]}; give positive_label= to say "
                "which one is the positive class (only 0/1 and -1/1 labels have a default)")
        positive_label = 1
    elif len(labels) > 2:
        raise InvalidArgumentError(f"the curve needs two classes; y_true has {len(labels)}: "
                                   f"{labels.tolist()[:10]}")
    return (y_true == positive_label).astype(np.float64)


def _clf_curve(y: Any, score: Any) -> tuple[Any, Any, Any]:
    """Cumulative true and false positives at each distinct score, highest score first."""
    np = _np()
    order = np.argsort(score, kind="mergesort")[::-1]
    score, y = score[order], y[order]
    distinct = np.where(np.diff(score))[0]
    idx = np.r_[distinct, y.size - 1]
    tps = np.cumsum(y)[idx]
    fps = 1 + idx - tps
    return fps, tps, score[idx]


def _scores(values: Any, what: str) -> Any:
    np = _np()
    try:
        score = values.astype(np.float64)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"the {what} must be numbers: {e}") from e
    if not np.all(np.isfinite(score)):
        raise InvalidArgumentError(f"the {what} contain NaN or infinity")
    return score


def precision_recall(y_true: Sequence[Any], probabilities: Sequence[Any],
                     positive_label: Any, title: str | None,
                     no_skill: float | None) -> dict[str, Any]:
    np = _np()
    t, p = _pair(y_true, probabilities, "predicted probabilities")
    y = _binary(t, positive_label)
    fps, tps, _ = _clf_curve(y, _scores(p, "predicted probabilities"))
    if tps[-1] == 0:
        raise InvalidArgumentError("y_true has no positive example; precision and recall are "
                                   "undefined")
    predicted = tps + fps
    precision = np.divide(tps, predicted, out=np.zeros_like(tps), where=predicted != 0)
    recall = tps / tps[-1]
    precision = np.hstack((precision[::-1], 1.0))
    recall = np.hstack((recall[::-1], 0.0))
    average = float(-np.sum(np.diff(recall) * precision[:-1]))
    return {"type": "PrecisionRecallCurve", "version": 0, "title": title,
            "precision": precision.tolist(), "recall": recall.tolist(),
            "averagePrecisionScore": average, "noSkill": no_skill}


def roc_curve(y_true: Sequence[Any], y_score: Sequence[Any], title: str | None,
              positive_label: Any = None) -> dict[str, Any]:
    np = _np()
    t, s = _pair(y_true, y_score, "predicted scores")
    y = _binary(t, positive_label)
    fps, tps, _ = _clf_curve(y, _scores(s, "predicted scores"))
    if tps[-1] == 0 or fps[-1] == 0:
        raise InvalidArgumentError("y_true needs both positive and negative examples for a ROC "
                                   "curve")
    if len(fps) > 2:  # drop points on straight segments, as scikit-learn does
        keep = np.where(np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True])[0]
        fps, tps = fps[keep], tps[keep]
    fpr = np.r_[0.0, fps] / fps[-1]
    tpr = np.r_[0.0, tps] / tps[-1]
    area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))
    return {"type": "ROCCurve", "version": 0, "title": title,
            "falsePositiveRate": fpr.tolist(), "truePositiveRate": tpr.tolist(),
            "areaUnderCurve": area}
