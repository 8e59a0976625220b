"""tsconv.engine.fill: the torch twin of the forward fill gives the numpy fill's values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from tsconv.engine.fill import forward_fill_torch
from tsconv.io.contracts import BandReader
from tsconv.io.ffill import forward_fill

from ..helpers import write_store


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


def _fill_by_loop(block: np.ndarray, last: np.ndarray) -> np.ndarray:
    out, cur = block.copy(), last.copy()
    for i in range(block.shape[0]):
        ok = ~np.isnan(block[i])
        cur[ok] = block[i, ok]
        out[i] = cur
    return out


def test_forward_fill_equals_a_row_by_row_fill_whichever_columns_have_gaps():
    rng = np.random.default_rng(3)
    for gappy in (0, 1, 3, 4, 5, 8):  # columns with NaN, of 8: the few-columns path and the whole-block one
        block = rng.normal(size=(300, 8)).astype(np.float32)
        cols = rng.choice(8, size=gappy, replace=False)
        for c in cols:
            block[rng.random(300) < rng.uniform(0.05, 1.0), c] = np.nan
        if gappy:
            block[:, cols[0]] = np.nan  # a symbol with no value at all in the block
        for last in (np.full(8, np.nan, np.float32), rng.normal(size=8).astype(np.float32)):
            last[rng.random(8) < 0.3] = np.nan
            filled, state = forward_fill(block.copy(), last.copy())
            expected = _fill_by_loop(block, last)
            assert np.array_equal(filled, expected, equal_nan=True)
            assert np.array_equal(state, expected[-1], equal_nan=True)
    clean = rng.normal(size=(10, 3)).astype(np.float32)
    same, state = forward_fill(clean, np.zeros(3, np.float32))
    assert same is clean and np.array_equal(state, clean[-1])


class _Spy(BandReader):
    """A BandReader over an array that records the rows it was asked for."""

    def __init__(self, x: np.ndarray, band_rows: int) -> None:
        self.x, self.band_rows, self.n_features, self.reads = x, band_rows, x.shape[1], []

    def read(self, a: int, b: int) -> np.ndarray:
        self.reads.append((a, b))
        return self.x[a:b]


def _listings(*, seed: int) -> np.ndarray:
    """5,000 x 6 values with 30% of prints missing; symbol 1 never listed, 2 listed at row 4,000, 3 delisted
    at row 600."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(5000, 6)).astype(np.float32)
    x[rng.random(x.shape) < 0.3] = np.nan
    x[:, 1] = np.nan
    x[:4000, 2] = np.nan
    x[600:, 3] = np.nan
    return x


def test_a_recorded_fill_state_gives_the_walks_state_and_bounds_it():
    """From a (row, state) recorded at a row before or after the one asked for, the state is the full walk's;
    a feature with no value yet (a symbol not listed) no longer sends the walk back to row 0."""
    from tsconv.engine.fill import fill_record, fill_state_before, parse_fill_record

    x = _listings(seed=1)
    x[4990:, 4] = np.nan
    f32 = np.dtype(np.float32)
    for k in (0, 100, 3333, 4100, 4999, 5000):
        known = parse_fill_record(fill_record(k, fill_state_before(_Spy(x, 64), k, f32)), 6)
        assert known is not None and known[0] == k
        for row in (0, 1, 63, 64, 2000, 3333, 4096, 4100, 4500, 5000):
            if k > row and k - row > 1500:
                continue  # records serve rows a little before them (an update's restart), not far back
            spy = _Spy(x, 64)
            got = fill_state_before(spy, row, f32, known=known)
            np.testing.assert_array_equal(
                got, fill_state_before(_Spy(x, 64), row, f32), err_msg=f"k={k} row={row}"
            )
            if k <= row:
                assert all(a >= k for a, _ in spy.reads), (k, row)
    # without a record the never-listed symbol walks back to row 0; with one from 100 rows later, it does not
    spy = _Spy(x, 64)
    fill_state_before(spy, 4900, f32)
    assert min(a for a, _ in spy.reads) == 0
    spy = _Spy(x, 64)
    fill_state_before(spy, 4900, f32, known=(5000, fill_state_before(_Spy(x, 64), 5000, f32)))
    assert min(a for a, _ in spy.reads) >= 4000  # column 2's first value: the walk stops there


def test_first_values_bound_the_walk_and_give_the_same_state():
    """Each feature's first row with a value, read forward until all have one: with it a walk back stops for
    a feature not trading yet at the row asked for, and the state is the full walk's."""
    from tsconv.engine.fill import fill_state_before, first_values

    x = _listings(seed=2)
    x[0, 0] = 1.0
    want = [
        int(np.flatnonzero(~np.isnan(x[:, j]))[0]) if (~np.isnan(x[:, j])).any() else 5000 for j in range(6)
    ]
    spy = _Spy(x, 64)
    assert first_values(spy, stop=5000).tolist() == want
    assert max(b for _, b in spy.reads) == 5000  # the never-listed symbol: the whole input, once
    x2 = x.copy()
    x2[:, 1] = 7.0
    x2[:100, 2] = 3.0
    spy = _Spy(x2, 64)
    assert (
        first_values(spy, stop=5000)[2] < 100 and max(b for _, b in spy.reads) <= 128
    )  # all trade: a band or two
    first = np.array(want)
    f32 = np.dtype(np.float32)
    for row in (0, 1, 64, 599, 600, 2000, 4000, 4001, 4999, 5000):
        spy = _Spy(x, 64)
        got = fill_state_before(spy, row, f32, first=first)
        np.testing.assert_array_equal(got, fill_state_before(_Spy(x, 64), row, f32), err_msg=f"row={row}")
        if 600 < row < 4000:  # column 1 never, column 2 not yet: only the delisted column 3 walks back far
            assert min((a for a, _ in spy.reads), default=row) >= 512, (row, spy.reads[-3:])
    spy = _Spy(x, 64)
    fill_state_before(spy, 3900, f32)  # without them: back to row 0
    assert min(a for a, _ in spy.reads) == 0


def test_a_fill_record_of_another_shape_or_garbage_is_not_used():
    from tsconv.engine.fill import parse_fill_record

    assert parse_fill_record({"row": 5, "state": [1.0, None]}, 3) is None
    assert parse_fill_record({"row": "5", "state": [1.0]}, 1) is None
    assert parse_fill_record({"row": 5, "state": ["x"]}, 1) is None
    assert parse_fill_record(None, 1) is None
    got = parse_fill_record({"row": 5, "state": [1.5, None]}, 2)
    assert got is not None and got[0] == 5 and got[1][0] == 1.5 and np.isnan(got[1][1])


def test_the_state_is_each_features_last_value_however_far_back_in_a_long_band():
    """The walk looks at a band's newest rows first: each feature still gets its last value before the row,
    whether it lies 1 row back, just across a window's edge, deep in the band, in an earlier band, or
    nowhere (NaN)."""
    from tsconv.engine.fill import fill_state_before

    depths = [1, 2, 1023, 1024, 1025, 1026, 5119, 5120, 5121, 30_000, 149_999, 150_000, 200_000, None]
    rows = 300_000
    x = np.full((rows, len(depths)), np.nan, np.float32)
    row = 250_000  # inside the second 200,000-row band
    for j, d in enumerate(depths):
        if d is not None:
            x[row - d, j] = j + 0.5
            x[: row - d : 97, j] = -1.0  # older values, which must not win
        x[row:, j] = 7.0  # rows at and after ``row`` do not count
    got = fill_state_before(_Spy(x, 200_000), row, np.dtype(np.float32))
    want = [np.nan if d is None else j + 0.5 for j, d in enumerate(depths)]
    np.testing.assert_array_equal(got, np.array(want, np.float32))


@pytest.mark.parametrize("select", [None, (1, 2, 5, 6, 9, 11)])
def test_the_scan_for_first_values_decodes_only_the_chunks_of_features_still_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, select: tuple[int, ...] | None
) -> None:
    """Once a band gives most features their first value, later bands decode only the chunk files of the
    column groups holding the others (a store whose chunks split the features, as zarr's defaults do), and
    the rows found are a full scan's; through a column selection too."""
    import collections

    import tsconv.io.readers.threads as threads
    from tsconv.engine.fill import first_values
    from tsconv.io.readers.blocks import ColumnSource

    rng = np.random.default_rng(4)
    x = rng.normal(size=(8000, 12)).astype(np.float32)
    x[rng.random(x.shape) < 0.2] = np.nan
    x[:6500, 5] = np.nan  # listed late: its group of 4 columns is read to row 6,500
    x[:, 9] = np.nan  # never listed: its group to the end
    x[:1200, 2] = np.nan  # listed in the second band
    src = write_store(tmp_path / "in.zarr", x, chunks=(1000, 4), time=False)
    decoded: collections.Counter[tuple[int, int]] = collections.Counter()
    real = threads.decode_chunk_into

    def counting(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        band, col = (int(p) for p in Path(path).parts[-2:])
        decoded[(band, col)] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(threads, "decode_chunk_into", counting)
    arr = zarr.open_array(str(src / "values"), mode="r")
    cols = list(range(12)) if select is None else list(select)
    want = [int(np.flatnonzero(~np.isnan(x[:, j]))[0]) if (~np.isnan(x[:, j])).any() else 8000 for j in cols]
    with threads.ParallelBandReader(arr, threads=2, prefetch=1) as reader:
        source = reader if select is None else ColumnSource(reader, select)
        assert first_values(source, stop=8000).tolist() == want
    groups = {band: {c for b, c in decoded if b == band} for band in range(8)}
    assert all(groups[b] == {0, 1, 2} for b in (0, 1)), groups  # the first band, and the one read ahead of it
    assert all(groups[b] <= {1, 2} and 2 in groups[b] for b in range(3, 8)), groups  # 5's and 9's groups
    assert max(decoded.values()) == 1
