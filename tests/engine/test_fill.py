"""tsconv.engine.fill: the torch twin of the forward fill gives the numpy fill's values."""

from __future__ import annotations

import numpy as np
import torch

from tsconv.engine.fill import forward_fill, forward_fill_torch


def test_forward_fill_torch_equals_the_numpy_fill():
    rng = np.random.default_rng(0)
    block = rng.normal(size=(40, 5)).astype(np.float32)
    block[rng.random(block.shape) < 0.4] = np.nan
    block[:7, 1] = np.nan  # NaN before a feature's first value: the state fills it, or it stays NaN
    block[3, 2] = np.inf  # an infinity is a value: it is carried like any other
    block[:, 4] = np.nan
    for last in (np.full(5, np.nan, np.float32), np.arange(5, dtype=np.float32)):
        expected, _ = forward_fill(block.copy(), last.copy())
        got = forward_fill_torch(torch.from_numpy(block), torch.from_numpy(last)).numpy()
        np.testing.assert_array_equal(got, expected)
