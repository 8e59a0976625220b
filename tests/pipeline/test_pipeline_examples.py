"""Every example pipeline in pipelines/ loads and runs, and matches the float64 reference."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import tsconv
from tsconv.pipeline.spec import DEFAULT_PIPELINE_TOML, load_pipeline, resolve
from tsconv.synth import feature_names

from ..helpers import assert_matches_reference, price_series

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


@pytest.mark.parametrize("path", sorted(PIPELINES.glob("*.toml")), ids=lambda p: p.stem)
def test_example_pipeline_runs_on_a_64_feature_series(path: Path) -> None:
    x = price_series(1200, 64, seed=7, nan_fraction=0.01)
    names = feature_names(64)  # px_0, vol_0, spread_0, px_1, ...: as in synthetic stores
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the examples must not trip the FP16 sum-shift warning
        pipe = load_pipeline(path)
        plan = resolve(pipe, names)
        y = tsconv.features(x, pipe, names=names, chunk=500)
    assert_matches_reference(y, x, plan)
    assert not np.isnan(y[plan.halo + 20 :]).all()


def test_default_toml_is_the_built_in_default() -> None:
    assert (PIPELINES / "default.toml").read_text() == DEFAULT_PIPELINE_TOML
