"""The logged graphs match scikit-learn's documented examples, in SageMaker's JSON shapes."""

from __future__ import annotations

import pytest

from shoal.errors import InvalidArgumentError
from shoal.experiments import _graphs

Y = [0, 0, 1, 1]
SCORES = [0.1, 0.4, 0.35, 0.8]


def test_confusion_matrix_rows_are_true_labels_in_sorted_order() -> None:
    data = _graphs.confusion_matrix(["cat", "dog", "dog", "bird"],
                                    ["cat", "cat", "dog", "dog"], "pets")
    # labels: bird, cat, dog
    assert data == {"type": "ConfusionMatrix", "version": 0, "title": "pets",
                    "confusionMatrix": [[0, 0, 1], [0, 1, 0], [0, 1, 1]]}


def test_precision_recall_matches_scikit_learns_example() -> None:
    data = _graphs.precision_recall(Y, SCORES, None, "pr", 0.5)
    assert data["type"] == "PrecisionRecallCurve" and data["noSkill"] == 0.5
    assert data["precision"] == pytest.approx([0.5, 2 / 3, 0.5, 1.0, 1.0])
    assert data["recall"] == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.0])
    assert data["averagePrecisionScore"] == pytest.approx(0.8333333)


def test_positive_label_chooses_the_class() -> None:
    data = _graphs.precision_recall(["no", "no", "yes", "yes"], SCORES, "yes", None, None)
    assert data["recall"] == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.0])
    with pytest.raises(InvalidArgumentError, match="positive_label"):
        _graphs.precision_recall(["no", "no", "yes", "yes"], SCORES, None, None, None)


def test_roc_curve_matches_scikit_learns_example() -> None:
    data = _graphs.roc_curve([1, 1, 2, 2], SCORES, "roc", positive_label=2)
    assert data["falsePositiveRate"] == pytest.approx([0.0, 0.0, 0.5, 0.5, 1.0])
    assert data["truePositiveRate"] == pytest.approx([0.0, 0.5, 0.5, 1.0, 1.0])
    assert data["areaUnderCurve"] == pytest.approx(0.75)


def test_roc_drops_points_on_straight_segments() -> None:
    data = _graphs.roc_curve([0, 0, 0, 1, 1, 1], [0.1, 0.2, 0.3, 0.7, 0.8, 0.9], None)
    # scikit-learn: fpr [0, 0, 0, 1], tpr [0, 1/3, 1, 1] (the points at 0.8 and 0.1-0.3 go)
    assert data["falsePositiveRate"] == pytest.approx([0.0, 0.0, 0.0, 1.0])
    assert data["truePositiveRate"] == pytest.approx([0.0, 1 / 3, 1.0, 1.0])
    assert data["areaUnderCurve"] == pytest.approx(1.0)


@pytest.mark.parametrize("call, words", [
    (lambda: _graphs.confusion_matrix([0, 1], [0], None), "same length"),
    (lambda: _graphs.confusion_matrix([], [], None), "empty"),
    (lambda: _graphs.confusion_matrix([[0]], [[1]], None), "one-dimensional"),
    (lambda: _graphs.precision_recall([0, 0], [0.1, 0.2], None, None, None), "no positive"),
    (lambda: _graphs.precision_recall([0, 1], [0.1, float("nan")], None, None, None), "NaN"),
    (lambda: _graphs.precision_recall([0, 1], ["a", "b"], None, None, None), "numbers"),
    (lambda: _graphs.precision_recall([0, 1, 2], [0.1, 0.2, 0.3], 1, None, None),
     "two classes"),
    (lambda: _graphs.roc_curve([1, 1], [0.1, 0.2], None), "positive and negative"),
])
def test_bad_inputs_are_clear(call, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        call()
