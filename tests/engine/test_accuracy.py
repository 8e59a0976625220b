"""Tests that can catch an accuracy loss: exact results on tick-grid prices, and the per-output bound.

Prices of one binade (64 to 128, as ``price_series`` draws them) are float32 values whose differences are
exact in float32 (Sterbenz), and the engine centres the first stage on such a value, so it sums
differences of prices. Through the default bank the sums are exact too: a difference of two prices
(``diff:L``), or a 32-step deviation, whose terms are multiples of 2^-22 below 4 in magnitude
(``dev:32``; any partial sum of them fits float32's 24 bits). The float64 reference computes the same
values exactly, so these outputs must equal it bit for bit at every chunk edge: a one-tick error at a
chunk's first row, or a first stage that sums raw levels (2.6e-4 on ``dev:32``), fails here. The rest
(``dev:256``) is held to the per-output bound of ``tests.helpers.error_bound``.
"""

from __future__ import annotations

import numpy as np
import pytest

import tsconv
from tsconv.kernels.reference import pipeline_reference
from tsconv.pipeline.spec import default_pipeline, resolve

from ..helpers import assert_matches_reference, error_bound, price_series

ROWS, FEATURES = 3000, 4
NAMES = [f"x{j}" for j in range(FEATURES)]


def _tick_prices(seed: int) -> np.ndarray:
    x = price_series(ROWS, FEATURES, seed=seed)
    assert 64 <= x.min() and x.max() < 128  # one binade: the premise of exactness
    return x


@pytest.mark.parametrize("chunk", [100, 1024])
def test_the_default_bank_on_tick_prices_is_exact_at_every_chunk_edge(chunk: int) -> None:
    x = _tick_prices(seed=21)
    plan = resolve(default_pipeline(), NAMES)
    y = tsconv.features(x, chunk=chunk)
    ref = pipeline_reference(x, plan)
    exact = [j for j, name in enumerate(plan.output_names) if not name.endswith(".dev256")]
    assert len(exact) == 4 * FEATURES
    past = slice(plan.halo, None)  # the warm-up rows are NaN in both
    np.testing.assert_array_equal(y[past][:, exact], ref[past][:, exact].astype(np.float32))
    assert_matches_reference(y, x, plan)


def test_the_bound_of_a_difference_is_far_below_a_tick() -> None:
    """The bound an output gets follows its own taps and the moves it sees, not the price level and the
    bank's longest filter: ``diff:1`` (two taps on a tick grid) is bounded far below one tick, the
    256-step deviation by less than 1e-4, where the bound of every tap x (|x| + max|x|) gave 0.05."""
    x = _tick_prices(seed=22)
    plan = resolve(default_pipeline(), NAMES)
    bound = error_bound(x, plan)[plan.halo :]
    by_filter = {f: bound[:, [j for j, n in enumerate(plan.output_names) if n.endswith("." + f)]]
                 for f in ("diff1", "diff256", "dev32", "dev256")}  # fmt: skip
    assert by_filter["diff1"].max() < 1e-5
    assert by_filter["diff256"].max() < 1e-4
    assert by_filter["dev256"].max() < 1e-4
