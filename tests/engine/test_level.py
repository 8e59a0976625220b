"""tsconv.engine.level: the torch twin of the centring level gives the numpy rule's values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tsconv.engine.level import centering_level, centering_level_torch

from ..helpers import tripling_coin


def test_centering_level_torch_equals_the_numpy_rule():
    rows = np.array(
        [[np.nan, np.inf, 1.0, np.nan], [2.0, 3.0, 4.0, np.nan], [5.0, 6.0, 7.0, np.nan]], dtype=np.float32
    )
    # a feature without a level takes its first finite value in the rows (skipping inf), else 0
    for before in (np.full(4, np.nan, np.float32), np.array([9.0, np.nan, -1.0, np.nan], np.float32)):
        expected = centering_level(before, rows)
        got = centering_level_torch(torch.from_numpy(before), torch.from_numpy(rows)).numpy()
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(("taps", "spike"), [([1.0], 1e7), ([-1.0, 1.0], 1e7), ([-1.0, 1.0], 1e5),
                                              ([0.0, -1.0, 1.0], -1e7)])  # fmt: skip
def test_one_bad_print_before_a_chunk_is_not_the_next_chunks_level(taps: list[float], spike: float) -> None:
    """A first stage of one or two taps has a halo of 0 or 1 row: its level came from that row alone (or the
    fill state), so one bad print on a chunk's last row centred the whole next chunk on it, and the float32
    rows lost the moves (a [-1, 1] stage gave 0 for every difference). The level reads the last 5 rows
    whatever the halo, in a batch run, a stream and an update alike."""
    import tsconv

    rng = np.random.default_rng(0)
    rows, chunk = 3000, 1024
    x = (100 + np.cumsum(rng.integers(-3, 4, rows)) * 0.01).astype(np.float32)[:, None]
    x[chunk - 1, 0] = spike
    pipe = {"weight_dtype": "float32", "conv": [{"weights": np.array([[taps]])}]}
    got = tsconv.features(x, pipe, device="cpu", chunk=chunk)[:, 0].astype(np.float64)
    k = len(taps)
    want = _causal(x[:, 0].astype(np.float64), taps)
    after = slice(chunk + k, 2 * chunk)  # the next chunk, past the rows that read the print itself
    assert np.abs(got[after] - want[after]).max() <= 2e-5
    stream = tsconv.Stream(pipe, features=1, chunk=chunk, device="cpu")
    pushed = np.concatenate([stream.push(x[i : i + 700]) for i in range(0, rows, 700)])
    np.testing.assert_array_equal(pushed[:, 0], got.astype(np.float32))


def _causal(xd: np.ndarray, taps: list[float]) -> np.ndarray:
    """The causal conv of one float64 series with ``taps`` (last tap on the current step), NaN in its warm-up."""
    k, rows = len(taps), xd.shape[0]
    return sum(
        t * np.concatenate([np.full(k - 1 - j, np.nan), xd[: rows - (k - 1 - j)]]) for j, t in enumerate(taps)
    )


@pytest.mark.parametrize("burst", [(30, 31), (31, 32), (1022, 1023), (1023, 1024)])
@pytest.mark.parametrize("taps", [[1.0, -2.0, 1.0], [-1.0, 1.0], [0.0, 0.0, 0.0, 0.0, -1.0, 1.0]])
def test_two_bad_prints_in_a_row_are_not_a_blocks_level(burst: tuple[int, int], taps: list[float]) -> None:
    """The CPU's first stage re-centres per block of 16 output rows on a median of x near the block's first
    step. Of three samples (the step and the two before it), two bad prints in a row among them were the
    block's level, at any block edge (a chunk's included): every output of that block whose window does not
    hold them was off by up to 60% of the outputs' scale, silently. The median of five samples is not."""
    import tsconv

    rng = np.random.default_rng(1)
    rows, chunk = 1200, 1024
    x = (100 + np.cumsum(rng.integers(-3, 4, rows)) * 0.01).astype(np.float32)[:, None]
    x[list(burst), 0] = 1e8
    pipe = {"weight_dtype": "float32", "conv": [{"weights": np.array([[taps]])}]}
    got = tsconv.features(x, pipe, device="cpu", chunk=chunk)[:, 0].astype(np.float64)
    k = len(taps)
    want = _causal(x[:, 0].astype(np.float64), taps)
    clean = np.ones(rows, dtype=bool)
    clean[: k - 1] = False  # warm-up
    clean[burst[0] : burst[1] + k] = False  # the outputs whose window holds a print
    assert np.abs(got[clean] - want[clean]).max() <= 2e-5
    stream = tsconv.Stream(pipe, features=1, chunk=chunk, device="cpu")
    pushed = np.concatenate([stream.push(x[i : i + 37]) for i in range(0, rows, 37)])
    np.testing.assert_array_equal(pushed[:, 0], got.astype(np.float32))


@pytest.mark.parametrize("taps", [[-0.5, 0.0, 0.5], [0.3, -0.1, -0.2]])
def test_a_price_that_triples_within_a_chunk_keeps_its_moves_digits(taps: list[float]) -> None:
    """float32 rows were centred on the chunk's level in float32 before the blocks' re-centring: once a price
    had moved more than 2x from it (a coin at 1e-4 tripling within a features() call), x - level rounded at the
    level's resolution, and a difference of the price was 1.1e-5 of its scale off (0 now, as for float64
    rows), the same bits through a stream; rows within 2x of the level keep their float32 bits."""
    import tsconv

    rows = 20_000
    x = tripling_coin(rows)
    pipe = {"weight_dtype": "float32", "conv": [{"weights": np.array([[taps]])}]}
    got = tsconv.features(x, pipe, device="cpu", chunk=rows)[:, 0]
    want = _causal(x[:, 0].astype(np.float64), taps)
    k = len(taps)
    err = np.abs(got[k - 1 :] - want[k - 1 :]).max() / np.abs(want[k - 1 :]).max()
    assert err < 5e-7, err
    stream = tsconv.Stream(pipe, features=1, chunk=rows, device="cpu")
    pushed = np.concatenate([stream.push(x[i : i + 3001]) for i in range(0, rows, 3001)])
    np.testing.assert_array_equal(pushed[:, 0], got)
    # rows within 2x of the level (the first half) have the bits a series that never left it gives
    calm = tsconv.features(x[: rows // 2], pipe, device="cpu", chunk=rows)[:, 0]
    np.testing.assert_array_equal(got[: rows // 2], calm)
