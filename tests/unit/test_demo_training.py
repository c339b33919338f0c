"""The demo's training data: scikit-learn's digits, upsampled as torch would, split in two."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shoal.cli._demo_training import _bilinear, prepare_digits


def test_upsampling_matches_torch_bilinear_interpolation() -> None:
    import torch
    import torch.nn.functional as F

    images = np.random.default_rng(0).random((5, 8, 8))
    m = _bilinear(8, 28)
    ours = np.einsum("oi,nij,pj->nop", m, images, m)
    theirs = F.interpolate(torch.from_numpy(images)[:, None], size=(28, 28), mode="bilinear",
                           align_corners=False)[:, 0].numpy()
    assert np.abs(ours - theirs).max() < 1e-9


def test_digits_are_split_into_two_channels(tmp_path: Path) -> None:
    train, test, n_train, n_test = prepare_digits(tmp_path)
    assert (n_train, n_test) == (1438, 359)
    with np.load(train / "digits.npz") as a, np.load(test / "digits.npz") as b:
        assert a["images"].shape == (n_train, 28, 28) and a["images"].dtype == np.float32
        assert b["labels"].shape == (n_test,) and set(b["labels"]) == set(range(10))
        assert 0.0 <= a["images"].min() and a["images"].max() <= 1.0
        # disjoint: no test image is also a training image
        seen = {img.tobytes() for img in a["images"]}
        assert not any(img.tobytes() in seen for img in b["images"])
