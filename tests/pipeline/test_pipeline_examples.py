"""Every built-in pipeline (tsconv/pipeline/builtin/) loads and runs, and matches the float64 reference."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import tsconv
from tsconv.errors import PipelineError
from tsconv.pipeline.spec import (
    BUILTIN_DIR,
    DEFAULT_PIPELINE_TOML,
    builtin_descriptions,
    builtin_pipelines,
    load_pipeline,
    resolve,
)
from tsconv.synth import feature_names

from ..helpers import assert_matches_reference, price_series

PIPELINES = BUILTIN_DIR


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


def test_the_built_ins_are_every_shipped_file() -> None:
    assert list(builtin_pipelines()) == ["default", "dense_head", "multiscale", "returns_zscore", "trend_ema"]
    descriptions = builtin_descriptions()
    assert list(descriptions) == list(builtin_pipelines())
    assert all(d and d != name for name, d in descriptions.items())  # each has its own description


@pytest.mark.parametrize("name", ["default", "dense_head", "trend_ema"])
def test_a_bare_name_loads_the_built_in(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # from anywhere: not relative to the working directory
    pipe = load_pipeline(name)
    assert pipe.name == name and pipe.origin == str(BUILTIN_DIR / f"{name}.toml")
    assert pipe.text == (BUILTIN_DIR / f"{name}.toml").read_text()


def test_a_path_is_still_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("trend_ema.toml").write_text('name = "mine"\n[[conv]]\nfilters = ["id"]\n')
    assert load_pipeline("trend_ema.toml").name == "mine"  # a .toml suffix: a file, never the built-in
    assert load_pipeline("./trend_ema.toml").name == "mine"
    Path("mypipe").write_text('[[conv]]\nfilters = ["ma:2"]\n')
    assert load_pipeline("mypipe").name == "mypipe"  # a bare name that is a file and no built-in


def test_a_bare_name_that_is_neither_lists_the_built_ins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PipelineError) as info:
        load_pipeline("trend_emma")
    msg = str(info.value)
    assert "'trend_emma' is neither a pipeline file nor a built-in pipeline" in msg
    assert "default, dense_head, multiscale, returns_zscore, trend_ema" in msg
    assert "did you mean 'trend_ema'?" in info.value.hint
    with pytest.raises(PipelineError, match="does not exist.*built-in pipeline's name: default, dense_head"):
        load_pipeline("nope.toml")


@pytest.mark.parametrize("name", sorted(builtin_pipelines()))
def test_a_built_in_runs_on_a_demo_store_without_a_warning(name: str, tmp_path: Path) -> None:
    # `tsconv demo --rows 2000 --pipeline dense_head` warned that storing the head's weights as float16 moved
    # 'head.7' by 5.1e-4 of its scale, telling the user to set weight_dtype = "float32" in the built-in's file
    from tsconv.synth import make_ticks

    src = make_ticks(tmp_path / "ticks.zarr", rows=2000, features=64, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tsconv.TsconvWarning)
        tsconv.process(src, tmp_path / "out.zarr", pipeline=name, device="cpu", progress=False)
