"""tsconv.engine.level: the torch twin of the centring level gives the numpy rule's values."""

from __future__ import annotations

import numpy as np
import torch

from tsconv.engine.level import centering_level, centering_level_torch


def test_centering_level_torch_equals_the_numpy_rule():
    rows = np.array(
        [[np.nan, np.inf, 1.0, np.nan], [2.0, 3.0, 4.0, np.nan], [5.0, 6.0, 7.0, np.nan]], dtype=np.float32
    )
    # a feature without a level takes its first finite value in the rows (skipping inf), else 0
    for before in (np.full(4, np.nan, np.float32), np.array([9.0, np.nan, -1.0, np.nan], np.float32)):
        expected = centering_level(before, rows)
        got = centering_level_torch(torch.from_numpy(before), torch.from_numpy(rows)).numpy()
        np.testing.assert_array_equal(got, expected)
