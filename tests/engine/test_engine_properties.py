"""Property tests: the streamed, chunked result equals the whole-series float64 computation."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tsconv
from tsconv.pipeline.spec import pipeline_from_dict, resolve

from ..helpers import assert_matches_reference, error_bound, price_series, read_output, write_store

ACTS = ["none", "relu", "gelu", "tanh"]
# Random FP16 weights trip the sum-shift warning by design; here only the arithmetic is under test.
pytestmark = pytest.mark.filterwarnings("ignore::tsconv.errors.TsconvWarning")


@st.composite
def cases(draw, *, past_warmup: bool = False):
    """(x, pipeline dict, store chunks, chunk, warmup). ``past_warmup``: at least halo + 2 rows, and every
    feature's values filled from row T - 2 - halo on, so the outputs of row T - 2 are finite: a case always
    has rows past the warm-up with finite outputs and a later step to change (the causality test)."""
    rows = None if past_warmup else draw(st.integers(1, 2500))
    features = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    stages = []
    c = features
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["dense", "grouped", "depthwise", "bank"]))
        k = draw(st.integers(1, 6))
        dilation = draw(st.integers(1, 4))
        act = draw(st.sampled_from(ACTS))
        if kind == "bank":
            filters = draw(
                st.lists(
                    st.sampled_from(["ma:3", "diff:2", "dev:4", "ema:2", "id", "ma:8"]),
                    min_size=1,
                    max_size=3,
                    unique=True,
                )
            )
            stages.append({"filters": filters, "dilation": dilation, "activation": act})
            c = c * len(filters)
            continue
        divisors = [g for g in range(1, c + 1) if c % g == 0]
        groups = {"dense": 1, "depthwise": c}.get(kind) or draw(st.sampled_from(divisors))
        o = groups * draw(st.integers(1, 3))
        stage = {
            "weights": rng.normal(size=(o, c // groups, k)) / np.sqrt(k * c / groups),
            "dilation": dilation,
            "groups": groups,
            "activation": act,
            "weight_dtype": draw(st.sampled_from(["float16", "float32"])),
        }
        if draw(st.booleans()):
            stage["bias"] = rng.normal(size=o)
        stages.append(stage)
        c = o
    pipe = {"conv": stages}
    if draw(st.booleans()):
        pipe["head"] = {
            "weights": rng.normal(size=(c, draw(st.integers(1, 4)))),
            "activation": draw(st.sampled_from(ACTS)),
        }
    if past_warmup:
        halo = resolve(pipeline_from_dict(pipe), [f"x{j}" for j in range(features)]).halo
        rows = draw(st.integers(halo + 2, 2500))
    levels = draw(st.booleans())
    x = (
        price_series(rows, features, seed=seed)
        if levels
        else rng.normal(size=(rows, features)).astype(np.float32)
    )
    drawn = x.copy()
    if draw(st.booleans()):
        x[rng.random(x.shape) < draw(st.sampled_from([0.01, 0.2]))] = np.nan
    if draw(st.booleans()):
        x[: draw(st.integers(0, rows)), draw(st.integers(0, features - 1))] = (
            np.nan
        )  # a feature that starts late
    if past_warmup:
        x[rows - 2 - halo] = drawn[rows - 2 - halo]  # forward-filled from here on: finite outputs from T - 2
    store_chunks = (
        draw(st.sampled_from([1, 7, 100, 256, 999, 4096])) if rows < 300 else draw(st.integers(64, 1000)),
        draw(st.integers(1, features)),
    )
    chunk = draw(st.integers(1, 700))
    warmup = draw(st.sampled_from(["nan", "zero"]))
    return x, pipe, store_chunks, chunk, warmup


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(cases())
def test_streamed_store_equals_whole_series_reference(case):
    x, pipe, store_chunks, chunk, warmup = case
    pipeline = pipeline_from_dict(pipe)
    plan = resolve(pipeline, [f"x{j}" for j in range(x.shape[1])])
    if warmup == "nan" and x.shape[0] <= plan.halo:
        with pytest.raises(tsconv.TsconvError, match="warm-up"):
            tsconv.features(x, pipeline, warmup=warmup)
        return
    with tempfile.TemporaryDirectory() as tmp:
        src = write_store(Path(tmp) / "in.zarr", x, chunks=store_chunks)
        tsconv.process(src, Path(tmp) / "out.zarr", pipeline=pipeline, chunk=chunk, warmup=warmup)
        chunked = read_output(Path(tmp) / "out.zarr")
    assert_matches_reference(chunked, x, plan, warmup=warmup)
    whole = tsconv.features(x, pipeline, chunk=x.shape[0], warmup=warmup)
    assert_matches_reference(whole, x, plan, warmup=warmup)
    both = ~np.isnan(whole)
    np.testing.assert_array_equal(np.isnan(chunked), np.isnan(whole))
    assert (np.abs(chunked - whole)[both] <= 2 * error_bound(x, plan)[both]).all()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(past_warmup=True), st.data())
def test_causal_future_steps_do_not_change_the_past(case, data):
    """Every case checks something: the past it compares ends at a row t past the warm-up with a finite
    output (there always is one: ``cases(past_warmup=True)``), and at least one later step changes."""
    x, pipe, _, chunk, warmup = case
    pipeline = pipeline_from_dict(pipe)
    halo = resolve(pipeline, [f"x{j}" for j in range(x.shape[1])]).halo
    chunk = max(chunk, 64)  # small chunks are covered above; here they would only cost time
    before = tsconv.features(x, pipeline, chunk=chunk, warmup=warmup)
    checkable = halo + np.flatnonzero(np.isfinite(before[halo : x.shape[0] - 1]).any(axis=1))
    assert checkable.size, "no row past the warm-up with a finite output before the last row"
    t = int(data.draw(st.sampled_from(checkable.tolist()), label="t"))
    changed = x.copy()
    rng = np.random.default_rng(t)
    changed[t + 1 :] = rng.normal(size=changed[t + 1 :].shape) * 1e3
    changed[t + 1 :: 3] = np.nan
    after = tsconv.features(changed, pipeline, chunk=chunk, warmup=warmup)
    np.testing.assert_array_equal(before[: t + 1], after[: t + 1])
