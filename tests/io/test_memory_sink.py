"""In-memory sinks (tsconv.io.writers.memory): rows computed in place into features()'s result, or copied."""

from __future__ import annotations

import numpy as np
import pytest

import tsconv
from tsconv.io.writers.memory import ArraySink

from ..helpers import price_series


def test_reserved_rows_are_appended_without_a_copy_and_others_are_copied() -> None:
    sink = ArraySink(10, 3)
    place = sink.reserve(4)
    assert place.shape == (4, 3) and np.shares_memory(place, sink.out)
    place[:] = 1.0
    sink.append(place)
    other = np.full((6, 3), 2.0, dtype=np.float32)
    assert np.shares_memory(sink.reserve(6), sink.out[4:])
    sink.append(other)  # a block of its own: copied in
    sink.finish()
    np.testing.assert_array_equal(sink.out, np.r_[np.ones((4, 3)), np.full((6, 3), 2.0)])
    # feature-major (a frame's columns): the rows lent are a view with each column contiguous
    sink = ArraySink(10, 3, feature_major=True)
    place = sink.reserve(4)
    assert place.shape == (4, 3) and place.strides == (4, 40) and np.shares_memory(place, sink.out)
    place[:] = np.arange(3, dtype=np.float32)
    sink.append(place)
    sink.append(np.full((6, 3), 2.0, dtype=np.float32))  # transposed in
    sink.finish()
    np.testing.assert_array_equal(sink.out.T, np.r_[np.tile(np.arange(3.0), (4, 1)), np.full((6, 3), 2.0)])


@pytest.mark.parametrize(
    "pipeline", ["default", {"conv": [{"filters": ["ema:8", "zscore:20"], "activation": "gelu"}]}]
)
def test_features_computed_in_place_equal_the_copied_path(monkeypatch: pytest.MonkeyPatch, pipeline) -> None:  # noqa: ANN001
    """A bank pipeline's chunks are computed straight into the result: the same bits as appending copies, and
    every chunk of it arrives in place (no copy)."""
    x = price_series(5000, 3, seed=4, nan_fraction=0.02)
    copied: list[int] = []
    real = ArraySink.append

    def append(self: ArraySink, block: np.ndarray, **kw) -> None:  # noqa: ANN003
        if not np.shares_memory(block, self.out):
            copied.append(block.shape[0])
        real(self, block, **kw)

    monkeypatch.setattr(ArraySink, "append", append)
    got = tsconv.features(x, pipeline, chunk=777, device="cpu")
    assert copied == []
    monkeypatch.setattr(ArraySink, "reserve", lambda self, n: None)
    want = tsconv.features(x, pipeline, chunk=777, device="cpu")
    assert copied and sum(copied) == 5000
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "pipeline", ["default", {"conv": [{"filters": ["ema:8", "zscore:20"], "activation": "gelu"}]}]
)
@pytest.mark.parametrize("chunk", [777, 65536])
def test_a_frames_features_are_computed_into_its_columns(
    monkeypatch: pytest.MonkeyPatch, pipeline, chunk: int
) -> None:  # noqa: ANN001
    """A polars frame's result is computed into its feature-major columns (the compiled bank writes them
    directly; other banks through a copy): the same bits as the array's result, and nothing transposed."""
    import polars as pl

    from tsconv.io import transpose

    x = price_series(5000, 5, seed=7, nan_fraction=0.02)
    want = tsconv.features(x, pipeline, chunk=chunk, device="cpu", names=[f"s{j}" for j in range(5)])
    transposed: list[int] = []
    real = transpose.transpose_into
    monkeypatch.setattr("tsconv.io.writers.memory.transpose_into",
                        lambda dst, src: (transposed.append(src.shape[0]), real(dst, src))[1])  # fmt: skip
    frame = tsconv.features(
        pl.DataFrame({f"s{j}": x[:, j] for j in range(5)}), pipeline, chunk=chunk, device="cpu"
    )
    assert transposed == []
    np.testing.assert_array_equal(frame.to_numpy(), want)
