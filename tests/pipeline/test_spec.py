"""Pipeline specs: loading TOML and dicts, filter banks, resolution against the input features."""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import tsconv
from tsconv.errors import PipelineError, ShapeError, TsconvError, TsconvWarning
from tsconv.pipeline.filters import bank_weights, parse_filter
from tsconv.pipeline.spec import (
    DEFAULT_PIPELINE_TOML,
    builtin_pipelines,
    default_pipeline,
    load_pipeline,
    pipeline_from_dict,
    resolve,
)

NAMES3 = ("a", "b", "c")
RNG = np.random.default_rng(1234)


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def quiet_resolve(pipe, names=NAMES3):  # noqa: ANN001, ANN201
    """resolve() with FP16 sum-shift warnings silenced (random weights are not FP16-exact)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TsconvWarning)
        return resolve(pipe, names)


def strict_resolve(pipe, names=NAMES3):  # noqa: ANN001, ANN201
    """resolve() where any warning fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return resolve(pipe, names)


def causal_apply(x: np.ndarray, taps: np.ndarray, dilation: int = 1) -> np.ndarray:
    """The documented convention, with zero history: out[t] = sum_k w[k] * x[t - (K - 1 - k) * dilation]."""
    k = len(taps)
    out = np.zeros(len(x))
    for t in range(len(x)):
        for j in range(k):
            s = t - (k - 1 - j) * dilation
            if s >= 0:
                out[t] += taps[j] * x[s]
    return out


# ------------------------------------------------------------------------------------------ filters


@pytest.mark.parametrize("w", [1, 2, 5, 16, 100])
def test_ma_taps(w: int) -> None:
    taps = parse_filter(f"ma:{w}")
    assert taps.shape == (w,)
    assert taps.dtype == np.float64
    np.testing.assert_array_equal(taps, np.full(w, 1.0 / w))
    assert math.fsum(taps) == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("lag", [1, 3, 32])
def test_diff_taps(lag: int) -> None:
    taps = parse_filter(f"diff:{lag}")
    assert taps.shape == (lag + 1,)
    expected = np.zeros(lag + 1)
    expected[0], expected[-1] = -1.0, 1.0  # oldest tap first: x[t] - x[t - lag]
    np.testing.assert_array_equal(taps, expected)
    assert taps.sum() == 0.0


@pytest.mark.parametrize("w", [1, 4, 7, 256])
def test_dev_taps(w: int) -> None:
    taps = parse_filter(f"dev:{w}")
    assert taps.shape == (w,)
    np.testing.assert_array_equal(taps[:-1], np.full(w - 1, -1.0 / w))
    assert taps[-1] == 1.0 - 1.0 / w
    assert math.fsum(taps) == pytest.approx(0.0, abs=1e-15)  # zero-sum: level-free
    np.testing.assert_allclose(taps, np.eye(w)[-1] - parse_filter(f"ma:{w}"), rtol=0, atol=1e-16)


@pytest.mark.parametrize(
    ("spec", "span", "k"), [("ema:3", 3, 24), ("ema:10", 10, 83), ("ema:8:5", 8, 5), ("ema:2:1", 2, 1)]
)
def test_ema_taps(spec: str, span: int, k: int) -> None:
    taps = parse_filter(spec)
    assert taps.shape == (k,)
    assert math.fsum(taps) == pytest.approx(1.0, abs=1e-14)
    if k > 1:
        alpha = 2.0 / (span + 1.0)
        # geometric decay into the past, the largest weight on the current step (the last tap)
        np.testing.assert_allclose(taps[:-1] / taps[1:], np.full(k - 1, 1.0 - alpha), rtol=1e-12)
        assert taps.argmax() == k - 1


def test_ema_of_span_one_is_the_current_step() -> None:
    np.testing.assert_array_equal(parse_filter("ema:1"), [1.0])  # alpha = 1


@pytest.mark.parametrize("span", [2, 3, 8, 32, 255, 1000])
def test_ema_window_drops_less_than_float32_resolution(span: int) -> None:
    """ema:S's default window is the shortest whose dropped weight (1 - alpha)^K is at most 2^-24."""
    k = len(parse_filter(f"ema:{span}"))
    r = 1.0 - 2.0 / (span + 1.0)
    assert r**k <= 2.0**-24 < r ** (k - 1)


def test_id_taps() -> None:
    np.testing.assert_array_equal(parse_filter("id"), [1.0])


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("foo:3", "unknown filter 'foo:3'"),
        ("ma", "needs a parameter"),
        ("ma:0", "between 1 and"),
        (f"ma:{(1 << 16) + 1}", "between 1 and"),
        ("diff:2:3", "takes one parameter"),
        ("id:3", "takes no parameter"),
        ("ema:4:0", "taps must be between 1 and"),
        ("ma:-3", "unknown filter"),
        ("ma:1.5", "unknown filter"),
        ("", "unknown filter"),
        ("MA:4", "unknown filter"),
        (
            "ma:\u0661\u0666",
            "unknown filter",
        ),  # Arabic-Indic digits: a column name tsconv would not read back
    ],
)
def test_bad_filters(spec: str, match: str) -> None:
    with pytest.raises(PipelineError, match=match):
        parse_filter(spec)


@pytest.mark.parametrize("spec", ["ma:4", "diff:3", "dev:5", "ema:3", "ema:6:4", "id"])
def test_filters_are_causal_and_aligned_on_the_current_step(spec: str) -> None:
    taps = parse_filter(spec)
    k = len(taps)
    impulse = np.zeros(20 + k)
    impulse[10] = 1.0
    y = causal_apply(impulse, taps)
    assert (y[:10] == 0).all()  # nothing before the impulse: the filter never looks ahead
    assert y[10] == taps[-1]  # the last tap multiplies the current step
    np.testing.assert_array_equal(y[10 : 10 + k], taps[::-1])
    assert (y[10 + k :] == 0).all()


def test_bank_weights_layout() -> None:
    filters = ("ma:2", "diff:3", "id")
    w = bank_weights(filters, 3)
    assert w.shape == (9, 1, 4)  # [C * M, 1, K_max]
    for c in range(3):
        np.testing.assert_array_equal(w[c * 3 + 0, 0], [0, 0, 0.5, 0.5])  # left-padded: aligned on now
        np.testing.assert_array_equal(w[c * 3 + 1, 0], [-1, 0, 0, 1])
        np.testing.assert_array_equal(w[c * 3 + 2, 0], [0, 0, 0, 1])


def test_bank_through_the_engine_is_causal() -> None:
    """The same taps through tsconv.features: id is the input, diff:L is x[t] - x[t-L], ma:4 the mean."""
    x = np.zeros((40, 2), np.float32)
    x[:, 0] = np.arange(40) ** 2 % 17  # small integers: every result is exact in float32
    x[:, 1] = 3.0
    x[25, 1] = 7.0
    pipe = {"weight_dtype": "float32", "conv": [{"filters": ["id", "diff:1", "diff:3", "ma:4"]}]}
    y = tsconv.features(x, pipe, warmup="zero")
    assert y.shape == (40, 8)
    for f in range(2):
        col = x[:, f].astype(np.float64)
        for m, spec in enumerate(["id", "diff:1", "diff:3", "ma:4"]):
            ref = causal_apply(col, parse_filter(spec))
            # warmup="zero": history before step 0 is zero, applied after centring on the first level,
            # so compare from the first step whose window lies inside the series
            start = len(parse_filter(spec)) - 1
            np.testing.assert_allclose(y[start:, f * 4 + m], ref[start:], rtol=0, atol=1e-5, err_msg=spec)


# ------------------------------------------------------------------------------------ loading files


def test_toml_with_npy_weights_and_bias_relative_to_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "pipes"
    (d / "weights").mkdir(parents=True)
    w = RNG.normal(size=(4, 3, 5))
    b = RNG.normal(size=4)
    np.save(d / "weights" / "w.npy", w)
    np.save(d / "b.npy", b.astype(np.float32))
    text = '[[conv]]\nname = "dense"\nweights = "weights/w.npy"\nbias = "b.npy"\ndilation = 2\nactivation = "relu"\n'
    (d / "my-pipe.toml").write_text(text)
    monkeypatch.chdir(tmp_path)  # somewhere else than the TOML file: paths must not be cwd-relative
    pipe = load_pipeline(d / "my-pipe.toml")
    assert pipe.name == "my-pipe"  # defaults to the file's stem
    assert pipe.origin == str(d / "my-pipe.toml")
    assert pipe.text == text
    (stage,) = pipe.stages
    assert stage.name == "dense" and stage.dilation == 2 and stage.activation == "relu" and stage.groups == 1
    assert stage.weight.dtype == np.float64
    np.testing.assert_array_equal(stage.weight, w)
    np.testing.assert_array_equal(stage.bias, b.astype(np.float32).astype(np.float64))
    assert stage.source == {"weights": "weights/w.npy", "bias": "b.npy"}
    assert stage.weight_dtype == "float16"  # the default


def _outside_case(tmp_path: Path, case: str) -> str:
    """The weights path of ``case`` in sub/p.toml, for weights w.npy that lie in tmp_path (outside sub/)."""
    sub = tmp_path / "sub"
    if case == "parent":
        return "../w.npy"
    if case == "absolute":
        return str(tmp_path / "w.npy")
    (sub / "link.npy").symlink_to(tmp_path / "w.npy")  # inside the folder, pointing outside
    return "link.npy"


@pytest.mark.parametrize("case", ["parent", "absolute", "symlink"])
def test_weights_outside_the_pipeline_folder_are_refused(tmp_path: Path, case: str) -> None:
    np.save(tmp_path / "w.npy", np.ones((2, 3, 2)))
    (tmp_path / "sub").mkdir()
    rel = _outside_case(tmp_path, case)
    toml = tmp_path / "sub" / "p.toml"
    toml.write_text(f'[[conv]]\nweights = "{rel}"\n[[conv]]\nfilters = ["ma:2"]\n')
    with pytest.raises(PipelineError) as info:
        load_pipeline(toml)
    msg = str(info.value)
    assert f"weights file {rel!r}" in msg and "lies outside the pipeline file's folder" in msg
    assert str((tmp_path / "sub").resolve()) in msg and "hint: weight files must lie inside" in msg
    if case != "absolute":  # the message says where the path really leads
        assert f"resolves to {str((tmp_path / 'w.npy').resolve())!r}" in msg
    # The bias and the head are held to the same rule.
    np.save(tmp_path / "sub" / "w.npy", np.ones((2, 3, 2)))
    toml.write_text(f'[[conv]]\nweights = "w.npy"\nbias = "{rel}"\n')
    np.save(tmp_path / "w.npy", np.ones(2))
    with pytest.raises(PipelineError, match="bias file .* lies outside"):
        load_pipeline(toml)
    toml.write_text(f'[[conv]]\nweights = "w.npy"\n[head]\nweights = "{rel}"\n')
    with pytest.raises(PipelineError, match=r"\[head\]: weights file .* lies outside"):
        load_pipeline(toml)


def test_a_pipeline_file_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('[[conv]]\nfilters = ["ma:4"]\n', encoding="utf-8-sig")
    assert load_pipeline(tmp_path / "p.toml").stages[0].filters == ("ma:4",)


def test_a_link_to_a_pipeline_file_reads_the_weights_beside_the_file(tmp_path: Path) -> None:
    # a link to the built-in dense_head said "weights file 'weights/dense_32x64x5.npy' does not exist"
    (tmp_path / "lib").mkdir()
    (tmp_path / "run").mkdir()
    np.save(tmp_path / "lib" / "w.npy", np.ones((2, 3, 2)))
    (tmp_path / "lib" / "p.toml").write_text('[[conv]]\nweights = "w.npy"\n')
    (tmp_path / "run" / "p.toml").symlink_to(tmp_path / "lib" / "p.toml")
    p = load_pipeline(tmp_path / "run" / "p.toml")
    assert p.stages[0].weight.shape == (2, 3, 2) and p.origin == str(tmp_path / "run" / "p.toml")
    linked = tmp_path / "run" / "dense_head.toml"
    linked.symlink_to(builtin_pipelines()["dense_head"])
    assert load_pipeline(linked).head is not None


def test_a_weight_file_in_a_symlink_loop_is_a_pipeline_error(tmp_path: Path) -> None:
    # Path.resolve raised RuntimeError ("Symlink loop"): a traceback at the CLI
    (tmp_path / "w.npy").symlink_to(tmp_path / "w2.npy")
    (tmp_path / "w2.npy").symlink_to(tmp_path / "w.npy")
    (tmp_path / "p.toml").write_text('[[conv]]\nweights = "w.npy"\n')
    with pytest.raises(PipelineError, match="weights file 'w.npy' cannot be resolved"):
        load_pipeline(tmp_path / "p.toml")


@pytest.mark.parametrize("where", ["stage", "head"])
def test_a_name_with_a_control_character_is_refused(where: str) -> None:
    # it names every output: the store written held names that process and inspect then refused
    stage = {"weights": np.ones((2, 1, 2)), **({"name": "evil\x1b[31m\nrow"} if where == "stage" else {})}
    pipe = {"conv": [stage]}
    if where == "head":
        pipe["head"] = {"weights": np.ones((2, 1)), "name": "h\tx"}
    with pytest.raises(PipelineError, match="holds a control character"):
        pipeline_from_dict(pipe)


@pytest.mark.parametrize(
    ("key", "value"), [("name", "evil\x1b[31mRED\nfake line"), ("description", "a\x1bb")]
)
def test_a_pipeline_name_or_description_with_a_control_character_is_refused(key: str, value: str) -> None:
    # written raw into a Markdown report: an escape and a forged line
    with pytest.raises(PipelineError, match=f"'{key}' holds a control character"):
        pipeline_from_dict({key: value, "conv": [{"filters": ["ma:4"]}]})
    pipeline_from_dict({"description": "two\nlines\tand a tab", "conv": [{"filters": ["ma:4"]}]})


def test_weight_keys_of_the_wrong_type_name_the_key(tmp_path: Path) -> None:
    save_file({"a": np.ones((2, 1, 2), dtype=np.float32)}, str(tmp_path / "w.safetensors"))
    for bad in (5, ["a"]):
        with pytest.raises(PipelineError, match="weights_key must be a string"):
            pipeline_from_dict({"conv": [{"weights": str(tmp_path / "w.safetensors"), "weights_key": bad}]})
    np.save(tmp_path / "w.npy", np.ones((2, 1, 2)))
    as_path = pipeline_from_dict({"conv": [{"weights": tmp_path / "w.npy"}]})  # a Path is a path
    np.testing.assert_array_equal(as_path.stages[0].weight, np.ones((2, 1, 2)))


def test_a_path_object_to_safetensors_takes_weights_key(tmp_path: Path) -> None:
    # a pathlib.Path was refused: "weights_key applies only when weights is a .safetensors file"
    save_file({"a": np.ones((2, 1, 2), dtype=np.float32), "b": np.ones(2)}, str(tmp_path / "w.safetensors"))
    pipe = pipeline_from_dict({"conv": [{"weights": tmp_path / "w.safetensors", "weights_key": "a"}]})
    np.testing.assert_array_equal(pipe.stages[0].weight, np.ones((2, 1, 2)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_torch_only_safetensors_dtypes_are_read_exactly(tmp_path: Path, dtype: torch.dtype) -> None:
    # safetensors.numpy has no bfloat16: "data type 'bfloat16' not understood", with no hint
    from safetensors.torch import save_file as save_torch

    w = torch.tensor([[[1.5, -0.3125]], [[0.0078125, 2.0]]]).to(dtype)
    save_torch({"w": w, "other": torch.ones(3)}, str(tmp_path / "w.safetensors"))
    pipe = pipeline_from_dict(
        {
            "conv": [
                {"weights": str(tmp_path / "w.safetensors"), "weights_key": "w", "weight_dtype": "float32"}
            ]
        }
    )
    np.testing.assert_array_equal(pipe.stages[0].weight, w.to(torch.float32).numpy())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_torch_only_dtypes_given_as_tensors_are_read_exactly(dtype: torch.dtype) -> None:
    # a bfloat16 tensor (torch's training dtype) in a dict was refused as "a file path or a numeric array"
    w = torch.tensor([[[1.5, -0.3125]], [[0.0078125, 2.0]]]).to(dtype)
    b = torch.tensor([0.5, -1.0]).to(dtype)
    pipe = pipeline_from_dict({"conv": [{"weights": w, "bias": b, "weight_dtype": "float32"}]})
    np.testing.assert_array_equal(pipe.stages[0].weight, w.to(torch.float32).numpy())
    np.testing.assert_array_equal(pipe.stages[0].bias, b.to(torch.float32).numpy())


@pytest.mark.parametrize("where", ["top", "conv"])
def test_a_key_that_is_no_string_is_an_unknown_key_not_a_traceback(where: str) -> None:
    # difflib's TypeError ('int' object is not subscriptable) escaped for {1: 2}
    d = (
        {1: 2, "conv": [{"filters": ["diff:1"]}]}
        if where == "top"
        else {"conv": [{"filters": ["diff:1"], 1: 2}]}
    )
    with pytest.raises(PipelineError, match="unknown key 1"):
        pipeline_from_dict(d)


def test_a_masked_weight_array_is_refused_not_read_under_its_mask() -> None:
    # np.asarray drops the mask: the values under it (here 99) became weights without a word
    w = np.ma.masked_array([[[1.0, 99.0]], [[0.5, 2.0]]], mask=[[[0, 1]], [[0, 0]]])
    with pytest.raises(PipelineError, match="masked array with masked entries") as info:
        pipeline_from_dict({"conv": [{"weights": w}]})
    assert "filled(0.0)" in (info.value.hint or "")
    unmasked = np.ma.masked_array([[[1.0, 99.0]]], mask=False)  # nothing masked: the values are the weights
    pipe = pipeline_from_dict({"conv": [{"weights": unmasked}]})
    np.testing.assert_array_equal(pipe.stages[0].weight, [[[1.0, 99.0]]])


def test_a_torch_module_as_pipeline_names_the_classes_and_the_way_through() -> None:
    module = tsconv.nn.Pipeline.from_pipeline({"conv": [{"filters": ["ma:4"]}]}, ["a"])
    with pytest.raises(PipelineError) as info:
        tsconv.features(np.ones((10, 1)), module)
    msg = str(info.value)
    assert "tsconv.pipeline.spec.Pipeline" in msg and "got tsconv.nn.Pipeline" in msg
    assert "pass its .plan.pipeline" in msg
    out = tsconv.features(np.ones((10, 1)), module.plan.pipeline, names=["a"])  # the way the hint names
    assert np.asarray(out).shape == (10, 1)


def test_a_bias_is_kept_in_float32_under_fp16_weights() -> None:
    """Weights float16 holds exactly and a de-meaning bias of -100.03: stored as float16 the bias moved every
    output by 0.03 (5% of its scale), and the storage check, which looks at weights, said nothing."""
    x = 100.0 + np.cumsum(np.random.default_rng(5).integers(-1, 2, size=(400, 1)), axis=0) * 0.01
    w, b = np.array([[[0.0, 1.0]]]), np.array([-100.03])
    pipe = {
        "conv": [{"weights": w, "bias": b}],
        "head": {"weights": np.ones((1, 1)), "bias": np.array([-0.07])},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        y = tsconv.features(x, pipe)
    exact = x[:, 0] - 100.03 - 0.07
    assert np.nanmax(np.abs(y[1:, 0] - exact[1:])) < 1e-5


def test_weights_inside_the_pipeline_folder_are_read(tmp_path: Path) -> None:
    w = RNG.normal(size=(2, 3, 2))
    (tmp_path / "sub" / "weights" / "deep").mkdir(parents=True)
    np.save(tmp_path / "sub" / "weights" / "deep" / "w.npy", w)
    (tmp_path / "sub" / "weights" / "link.npy").symlink_to(tmp_path / "sub" / "weights" / "deep" / "w.npy")
    toml = tmp_path / "sub" / "p.toml"
    for rel in ["weights/deep/w.npy", "weights/../weights/deep/w.npy", "weights/link.npy",
                str(tmp_path / "sub" / "weights" / "deep" / "w.npy")]:  # fmt: skip
        toml.write_text(f'[[conv]]\nweights = "{rel}"\n')
        np.testing.assert_array_equal(load_pipeline(toml).stages[0].weight, w)


@pytest.mark.parametrize("case", ["parent", "absolute", "symlink"])
def test_a_pipeline_dict_reads_weights_from_anywhere(tmp_path: Path, case: str) -> None:
    # Library code passing a dict chooses its files itself: base_dir only anchors relative paths.
    w = RNG.normal(size=(2, 3, 2))
    np.save(tmp_path / "w.npy", w)
    (tmp_path / "sub").mkdir()
    rel = _outside_case(tmp_path, case)
    pipe = pipeline_from_dict({"conv": [{"weights": rel}]}, base_dir=tmp_path / "sub")
    np.testing.assert_array_equal(pipe.stages[0].weight, w)


def test_weights_are_not_resolved_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "w.npy", np.ones((2, 3, 2)))  # beside the cwd, not beside the TOML file
    (tmp_path / "sub" / "p.toml").write_text('[[conv]]\nweights = "w.npy"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PipelineError, match="does not exist.*relative to the pipeline file"):
        load_pipeline("sub/p.toml")


def test_toml_with_safetensors(tmp_path: Path) -> None:
    w = RNG.normal(size=(6, 1, 3)).astype(np.float32)
    b = RNG.normal(size=6).astype(np.float32)
    hw = RNG.normal(size=(6, 2)).astype(np.float32)
    save_file({"conv.weight": w, "conv.bias": b}, str(tmp_path / "model.safetensors"))
    save_file({"only": hw}, str(tmp_path / "head.safetensors"))
    text = (
        "[[conv]]\n"
        'weights = "model.safetensors"\nweights_key = "conv.weight"\n'
        'bias = "model.safetensors"\nbias_key = "conv.bias"\n'
        'groups = "depthwise"\nweight_dtype = "float32"\n'
        '[head]\nweights = "head.safetensors"\nweight_dtype = "float32"\n'
    )
    (tmp_path / "p.toml").write_text(text)
    pipe = load_pipeline(tmp_path / "p.toml")
    np.testing.assert_array_equal(pipe.stages[0].weight, w.astype(np.float64))
    np.testing.assert_array_equal(pipe.stages[0].bias, b.astype(np.float64))
    np.testing.assert_array_equal(pipe.head.weight, hw.astype(np.float64))  # one tensor: no key needed
    plan = strict_resolve(pipe)
    assert plan.layers[0].groups == 3
    np.testing.assert_array_equal(plan.layers[0].weight, w)
    np.testing.assert_array_equal(plan.layers[0].bias, b)
    np.testing.assert_array_equal(plan.head.weight, hw)
    assert plan.output_names == ("head.0", "head.1")


@pytest.mark.parametrize(
    ("stage", "files", "match"),
    [
        ({"weights": "m.safetensors"}, "two", r"holds 2 tensors \(a, b\).*weights_key"),
        ({"weights": "m.safetensors", "weights_key": "c"}, "two", r"has no tensor 'c'.*it holds: a, b"),
        (
            {"weights": "w.npy", "weights_key": "a"},
            "npy",
            "weights_key applies only when weights is a .safetensors file",
        ),
        ({"weights": "w.txt"}, "txt", "unknown type '.txt'"),
        (
            {"weights": "w.npy", "bias": "short.npy"},
            "npy",
            "bias has 2 values but weights have 4 output channels",
        ),
        ({"weights": "w.npy", "bias": "w.npy"}, "npy", r"bias in .* has shape \[4, 3, 2\], expected 1-D"),
        ({"weights": "short.npy"}, "npy", r"has shape \[2\], expected 3-D \[O, C/groups, K\]"),
        ({"weights": "nan.npy"}, "npy", "contains NaN or infinite values"),
        ({"weights": "empty.npy"}, "npy", r"is empty \(shape \[0, 3, 2\]\)"),
        ({"weights": "bool.npy"}, "npy", "non-numeric dtype bool"),
        ({"weights": "missing.npy"}, "npy", "does not exist"),
        ({"weights": ""}, "npy", "empty string"),
        ({"weights": "."}, "npy", "is not a regular file"),
        ({"weights": 5}, "npy", "must be a file path or a numeric array, got 5"),
        ({"filters": ["ma:4"], "bias": "short.npy"}, "npy", "'bias' does not apply to a filter bank"),
        ({"filters": ["ma:4"], "groups": 1}, "npy", "a filter bank is depthwise"),
        ({"filters": []}, "npy", "non-empty list of strings"),
        ({"filters": "ma:4"}, "npy", "non-empty list of strings"),
        ({"weights": "w.npy", "groups": 0}, "npy", "groups must be an integer >= 1"),
        ({"weights": "w.npy", "groups": "all"}, "npy", "groups must be an integer >= 1"),
        ({"weights": "w.npy", "dilation": 1.0}, "npy", "dilation must be an integer from 1 to"),
        ({"weights": "w.npy", "dilation": True}, "npy", "dilation must be an integer from 1 to"),
        ({"weights": "w.npy", "activation": "sigmoid"}, "npy", "activation = 'sigmoid' is not allowed"),
        ({"weights": "w.npy", "weight_dtype": "bfloat16"}, "npy", "weight_dtype = 'bfloat16' is not allowed"),
        ({"weights": "w.npy", "name": ""}, "npy", "name must be a non-empty string"),
    ],
)
def test_bad_stage(tmp_path: Path, stage: dict, files: str, match: str) -> None:
    save_file(
        {"a": np.ones((2, 3, 2), np.float32), "b": np.ones(2, np.float32)}, str(tmp_path / "m.safetensors")
    )
    np.save(tmp_path / "w.npy", np.ones((4, 3, 2)))
    np.save(tmp_path / "short.npy", np.ones(2))
    np.save(tmp_path / "nan.npy", np.array([[[1.0, np.nan]]]))
    np.save(tmp_path / "empty.npy", np.ones((0, 3, 2)))
    np.save(tmp_path / "bool.npy", np.ones((2, 3, 2), dtype=bool))
    (tmp_path / "w.txt").write_text("1 2 3")
    with pytest.raises(PipelineError, match=match) as info:
        pipeline_from_dict({"conv": [stage]}, base_dir=tmp_path, origin="p.toml")
    assert str(info.value).startswith("p.toml: [[conv]] #1")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ([], "a pipeline must be a table"),
        ({}, r"no \[\[conv\]\] stage"),
        ({"conv": []}, "'conv' must be an array of tables"),
        ({"conv": {"filters": ["id"]}}, "'conv' must be an array of tables"),
        ({"conv": [{"filters": ["id"]}], "head": [1]}, "'head' must be a table"),
        ({"conv": [{"filters": ["id"]}], "head": {}}, r"\[head\]: 'weights' is required"),
        ({"conv": [{"filters": ["id"]}], "name": 3}, "'name' must be a string"),
        (
            {"conv": [{"filters": ["id"]}], "weight_dtype": "float64"},
            "weight_dtype = 'float64' is not allowed",
        ),
        ({"conv": [{"filters": ["id"]}], "stages": []}, "unknown key 'stages'"),
        (
            {"conv": [{"filters": ["id"], "dilatation": 2}]},
            "unknown key 'dilatation'; hint: did you mean 'dilation'",
        ),
        (
            {"conv": [{"filters": ["id"]}], "head": {"weights": np.ones((3, 2)), "bias": np.ones(3)}},
            "head bias must",
        ),
        (
            {"conv": [{"filters": ["id"]}], "head": {"weights": np.ones((3, 2)), "groups": 1}},
            "unknown key 'groups'",
        ),
    ],
)
def test_bad_pipeline_dict(data: object, match: str) -> None:
    with pytest.raises(PipelineError, match=match):
        pipeline_from_dict(data)


def test_description_must_be_a_string() -> None:
    with pytest.raises(PipelineError, match="description"):
        pipeline_from_dict({"description": 3, "conv": [{"filters": ["id"]}]})


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text('[[conv]\nfilters = ["id"]\n')
    with pytest.raises(PipelineError, match=f"{p}: not valid TOML"):
        load_pipeline(p)
    with pytest.raises(PipelineError, match="does not exist"):
        load_pipeline(tmp_path / "missing.toml")
    with pytest.raises(PipelineError, match="is not a regular file"):
        load_pipeline(tmp_path)
    with pytest.raises(PipelineError, match="the pipeline is an empty string"):
        load_pipeline("")


# --------------------------------------------------------------------------------- dict pipelines


def test_dict_pipeline_with_arrays() -> None:
    w1 = RNG.normal(size=(4, 3, 3))
    b1 = RNG.normal(size=4)
    w2 = torch.randn(2, 2, 2, dtype=torch.float64)
    pipe = pipeline_from_dict(
        {
            "weight_dtype": "float32",
            "conv": [
                {"name": "dense", "weights": w1, "bias": b1},
                {"name": "grouped", "weights": w2, "groups": 2, "dilation": 3},
            ],
            "head": {"weights": [[1.0, 0.0, 2.0], [0.5, 1.0, 0.0]], "bias": [0.25, 0.5, 1.0], "name": "out"},
        }
    )
    assert pipe.origin == "<dict>" and pipe.name == "<dict>" and pipe.text is None
    assert pipe.stages[0].source == {"weights": "<array>", "bias": "<array>"}
    np.testing.assert_array_equal(pipe.stages[0].weight, w1)
    np.testing.assert_array_equal(pipe.stages[1].weight, w2.numpy())
    plan = strict_resolve(pipe)
    np.testing.assert_array_equal(plan.layers[0].weight, w1.astype(np.float32))
    np.testing.assert_array_equal(plan.layers[0].bias, b1.astype(np.float32))
    np.testing.assert_array_equal(plan.layers[1].weight, w2.numpy().astype(np.float32))
    assert plan.layers[1].groups == 2 and plan.layers[1].in_channels == 4 and plan.layers[1].out_channels == 2
    np.testing.assert_array_equal(plan.head.weight, [[1.0, 0.0, 2.0], [0.5, 1.0, 0.0]])
    assert plan.output_names == ("out.0", "out.1", "out.2")
    assert plan.halo == 2 * 1 + 1 * 3


@pytest.mark.parametrize("bad", [[[1.0, 2.0], [3.0]], object(), {"w": 1}, np.array([[[1]]], dtype=object)])
def test_dict_pipeline_rejects_non_numeric_weights(bad: object) -> None:
    with pytest.raises(PipelineError, match="weights must be a file path or a numeric array"):
        pipeline_from_dict({"conv": [{"weights": bad}]})


def test_dict_pipeline_array_checks() -> None:
    with pytest.raises(PipelineError, match=r"weights in <array> has shape \[3, 2\], expected 3-D"):
        pipeline_from_dict({"conv": [{"weights": np.ones((3, 2))}]})
    with pytest.raises(PipelineError, match="contains NaN or infinite"):
        pipeline_from_dict({"conv": [{"weights": np.full((1, 1, 2), np.inf)}]})
    with pytest.raises(PipelineError, match="non-numeric dtype complex128"):
        pipeline_from_dict({"conv": [{"weights": np.ones((1, 1, 2), complex)}]})


# ------------------------------------------------------------------------------------- resolution


def test_output_names() -> None:
    pipe = pipeline_from_dict(
        {
            "conv": [
                {"filters": ["ma:4", "diff:1", "ema:3", "id"]},
            ]
        }
    )
    plan = strict_resolve(pipe, ["px", "vol"])
    assert plan.input_names == ("px", "vol")
    assert plan.output_names == (
        "px.ma4", "px.diff1", "px.ema3", "px.id",
        "vol.ma4", "vol.diff1", "vol.ema3", "vol.id",
    )  # fmt: skip
    assert plan.n_outputs == 8
    two = pipeline_from_dict(
        {"conv": [{"name": "mix", "weights": np.ones((2, 2, 1))}, {"filters": ["diff:2", "dev:4"]}]}
    )
    assert strict_resolve(two, ["px", "vol"]).output_names == (
        "mix.0.diff2",
        "mix.0.dev4",
        "mix.1.diff2",
        "mix.1.dev4",
    )
    headed = pipeline_from_dict({"conv": [{"filters": ["id"]}], "head": {"weights": np.ones((2, 3))}})
    assert strict_resolve(headed, ["px", "vol"]).output_names == ("head.0", "head.1", "head.2")


def test_distinct_filters_get_distinct_output_names() -> None:
    plan = quiet_resolve(pipeline_from_dict({"conv": [{"filters": ["ema:8:4", "ema:84"]}]}), ["px"])
    assert len(set(plan.output_names)) == plan.n_outputs


def test_halo_is_the_sum_over_stages() -> None:
    pipe = pipeline_from_dict(
        {
            "weight_dtype": "float32",
            "conv": [
                {"filters": ["ma:4", "diff:8"], "dilation": 2},  # K = 9
                {"weights": np.ones((3, 6, 3)), "dilation": 3},  # K = 3
                {"weights": np.ones((3, 1, 5)), "groups": "depthwise"},  # K = 5
                {"filters": ["id"], "dilation": 7},  # K = 1: no halo whatever the dilation
            ],
        }
    )
    plan = strict_resolve(pipe)
    assert [layer.halo for layer in plan.layers] == [16, 6, 4, 0]
    assert [layer.taps for layer in plan.layers] == [9, 3, 5, 1]
    assert plan.halo == 26
    assert strict_resolve(default_pipeline()).halo == 256


def test_depthwise_groups() -> None:
    w = RNG.normal(size=(3, 1, 4))
    plan = quiet_resolve(pipeline_from_dict({"conv": [{"weights": w, "groups": "depthwise"}]}))
    assert plan.layers[0].groups == 3 and plan.layers[0].in_channels == 3
    # a channel multiplier of 2, and the same width bound to 5 features
    w2 = RNG.normal(size=(10, 1, 2))
    plan = quiet_resolve(
        pipeline_from_dict({"conv": [{"weights": w2, "groups": "depthwise"}]}), list("abcde")
    )
    assert plan.layers[0].groups == 5 and plan.layers[0].out_channels == 10
    with pytest.raises(ShapeError, match="expect 6 input channels, but the stage receives 3"):
        resolve(
            pipeline_from_dict({"conv": [{"weights": np.ones((3, 2, 4)), "groups": "depthwise"}]}), NAMES3
        )
    with pytest.raises(ShapeError, match="3 output channels are not a multiple of groups = 2"):
        resolve(
            pipeline_from_dict({"conv": [{"weights": np.ones((3, 1, 4)), "groups": "depthwise"}]}), ["a", "b"]
        )


def test_shape_errors_name_the_stage() -> None:
    pipe = pipeline_from_dict(
        {"conv": [{"filters": ["id", "ma:2"]}, {"name": "mix", "weights": np.ones((2, 5, 1))}]},
        origin="x.toml",
    )
    with pytest.raises(
        ShapeError,
        match=r"x.toml: \[\[conv\]\] #2 \(mix\): .* expect 5 input channels, but the stage receives 6",
    ):
        resolve(pipe, NAMES3)


# ---------------------------------------------------------------------------------- weight dtypes


def test_float16_rounding_is_applied() -> None:
    w = RNG.normal(size=(4, 3, 5))
    b = RNG.normal(size=4)
    hw = RNG.normal(size=(4, 2))
    hb = RNG.normal(size=2)
    plan = quiet_resolve(
        pipeline_from_dict({"conv": [{"weights": w, "bias": b}], "head": {"weights": hw, "bias": hb}})
    )
    layer = plan.layers[0]
    assert layer.weight_dtype == "float16" and layer.weight.dtype == np.float32
    np.testing.assert_array_equal(layer.weight, w.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(layer.bias, b.astype(np.float32))  # biases stay float32
    np.testing.assert_array_equal(plan.head.weight, hw.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(plan.head.bias, hb.astype(np.float32))
    assert (layer.weight != w.astype(np.float32)).any()  # the rounding did something


def test_float32_keeps_values() -> None:
    w = RNG.normal(size=(4, 3, 5))
    b = RNG.normal(size=4)
    data = {
        "conv": [{"weights": w, "bias": b, "weight_dtype": "float32"}],
        "head": {"weights": np.full((4, 1), 0.1)},
    }
    plan = quiet_resolve(pipeline_from_dict(data))
    np.testing.assert_array_equal(plan.layers[0].weight, w.astype(np.float32))
    np.testing.assert_array_equal(plan.layers[0].bias, b.astype(np.float32))
    assert plan.layers[0].weight_dtype == "float32"
    assert plan.head.weight_dtype == "float16"  # the stage's dtype does not leak into the head
    assert plan.head.weight[0, 0] == np.float32(np.float16(0.1)) != np.float32(0.1)
    # the top-level default applies to every stage without its own
    top = quiet_resolve(
        pipeline_from_dict({"weight_dtype": "float32", "conv": [{"weights": w}, {"filters": ["ma:3"]}]})
    )
    assert [layer.weight_dtype for layer in top.layers] == ["float32", "float32"]
    np.testing.assert_array_equal(top.layers[0].weight, w.astype(np.float32))
    np.testing.assert_array_equal(top.layers[1].weight[0, 0], np.full(3, 1 / 3, dtype=np.float32))


def test_layers_keep_the_weights_as_given_and_their_exact_tap_sums() -> None:
    plan = strict_resolve(pipeline_from_dict({"conv": [{"filters": ["ma:5", "dev:10"]}]}))
    layer = plan.layers[0]
    assert layer.weight.dtype == np.float32 and layer.given.dtype == np.float64
    np.testing.assert_array_equal(layer.given, bank_weights(("ma:5", "dev:10"), 3))
    assert not np.array_equal(layer.weight, layer.given)  # 0.2 and 0.1 are rounded in float16
    np.testing.assert_allclose(layer.tap_sums[:, 0], np.tile([1.0, 0.0], 3), atol=1e-15)


def test_weights_beyond_float16_range_are_refused() -> None:
    pipe = pipeline_from_dict({"conv": [{"weights": np.full((1, 3, 2), 1e5)}]})  # float16 max is 65504
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TsconvError):
            resolve(pipe, NAMES3)  # today: Layer.weight is all inf


def test_a_bias_beyond_float16_range_is_kept_and_one_beyond_float32_refused() -> None:
    pipe = pipeline_from_dict({"conv": [{"weights": np.ones((1, 3, 2)), "bias": np.array([1e5])}]})
    assert resolve(pipe, NAMES3).layers[0].bias.tolist() == [1e5]  # biases are kept in float32
    pipe = pipeline_from_dict({"conv": [{"weights": np.ones((1, 3, 2)), "bias": np.array([1e39])}]})
    with pytest.raises(TsconvError, match="does not fit float32"):
        resolve(pipe, NAMES3)


def test_default_pipeline() -> None:
    pipe = default_pipeline()
    assert pipe.name == "default" and pipe.origin == "default" and pipe.text == DEFAULT_PIPELINE_TOML
    plan = strict_resolve(pipe, ["p", "q"])  # no FP16 warning: every weight is exact
    (layer,) = plan.layers
    filters = ("diff:1", "diff:32", "diff:256", "dev:32", "dev:256")
    assert layer.weight_dtype == "float16" and layer.groups == 2
    exact = bank_weights(filters, 2)
    assert layer.weight.shape == exact.shape == (10, 1, 257)
    np.testing.assert_array_equal(layer.weight.astype(np.float64), exact)  # every weight exact in float16
    assert plan.output_names[:5] == ("p.diff1", "p.diff32", "p.diff256", "p.dev32", "p.dev256")
    assert plan.halo == 256 and plan.head is None


# ----------------------------------------------------------------------------- as_run, fingerprint


def test_as_run_records_weight_hashes(tmp_path: Path) -> None:
    w = RNG.normal(size=(3, 1, 3))
    b = RNG.normal(size=3)
    hw = RNG.normal(size=(3, 4))
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "b.npy", b)
    np.save(tmp_path / "h.npy", hw)
    text = (
        'name = "p"\nweight_dtype = "float32"\n'
        '[[conv]]\nfilters = ["ma:2"]\n'
        '[[conv]]\nweights = "w.npy"\nbias = "b.npy"\ngroups = 3\nweight_dtype = "float16"\n'
        '[head]\nweights = "h.npy"\nactivation = "tanh"\n'
    )
    (tmp_path / "p.toml").write_text(text)
    plan = quiet_resolve(load_pipeline(tmp_path / "p.toml"), ["x", "y", "z"])
    run = plan.as_run()
    assert json.loads(json.dumps(run)) == run  # JSON-able
    assert run["name"] == "p" and run["origin"] == str(tmp_path / "p.toml") and run["text"] == text
    assert run["halo"] == 1 + 2
    bank, conv = run["stages"]
    assert bank["filters"] == ["ma:2"] and bank["groups"] == 3 and bank["shape"] == [3, 1, 2]
    assert bank["weight_sha256"] == sha(bank_weights(("ma:2",), 3).astype(np.float32))
    assert bank["bias_sha256"] is None
    assert conv["weights"] == "w.npy" and conv["bias"] == "b.npy" and conv["weight_dtype"] == "float16"
    # the hashes are of the values as they run: rounded to FP16, held as float32
    assert conv["weight_sha256"] == sha(w.astype(np.float16).astype(np.float32))
    assert conv["bias_sha256"] == sha(b.astype(np.float32))  # biases are kept in float32
    assert run["head"]["weights"] == "h.npy" and run["head"]["activation"] == "tanh"
    assert conv["shape"] == [3, 1, 3] and conv["groups"] == 3
    assert run["head"]["weight_sha256"] == sha(hw.astype(np.float32)) and run["head"]["shape"] == [3, 4]


def _fp(**changes: object) -> str:
    conv = {"weights": np.arange(12.0).reshape(2, 3, 2) / 4, "bias": np.array([0.5, -0.5]), "dilation": 2}
    conv.update(
        {
            k: v
            for k, v in changes.items()
            if k in ("weights", "bias", "dilation", "activation", "weight_dtype")
        }
    )
    data = {"name": "p", "conv": [conv], "head": {"weights": changes.get("head", np.ones((2, 3)))}}
    names = changes.get("names", NAMES3)
    return strict_resolve(
        pipeline_from_dict(data, origin=str(changes.get("origin", "<dict>"))), names
    ).fingerprint()


def test_fingerprint_changes_with_the_computation() -> None:
    base = _fp()
    assert _fp() == base  # deterministic
    assert _fp(origin="elsewhere.toml") == base  # where it came from does not change the computation
    w = np.arange(12.0).reshape(2, 3, 2) / 4
    w[1, 2, 0] += 0.25
    changed = [
        _fp(weights=w),
        _fp(bias=np.array([0.5, -0.25])),
        _fp(dilation=3),
        _fp(activation="relu"),
        _fp(weight_dtype="float32", weights=w),
        _fp(head=np.full((2, 3), 0.5)),
        _fp(names=("a", "b", "d")),
    ]
    assert base not in changed
    assert len(set(changed)) == len(changed)


def test_fingerprint_changes_with_a_weight_file(tmp_path: Path) -> None:
    w = np.full((2, 3, 2), 0.25)
    np.save(tmp_path / "w.npy", w)
    (tmp_path / "p.toml").write_text('[[conv]]\nweights = "w.npy"\n')
    first = strict_resolve(load_pipeline(tmp_path / "p.toml")).fingerprint()
    assert strict_resolve(load_pipeline(tmp_path / "p.toml")).fingerprint() == first
    w[0, 0, 0] = 0.5
    np.save(tmp_path / "w.npy", w)  # same path, same TOML, new contents
    assert strict_resolve(load_pipeline(tmp_path / "p.toml")).fingerprint() != first


def test_fingerprint_tells_apart_weights_that_round_alike_but_sum_apart() -> None:
    # the level term uses the tap sums of the weights as given: two files storing the same float16 values
    # computed apart, and an update mixed their outputs under one fingerprint
    w = np.full((2, 3, 2), 0.1)
    nudged = w.copy()
    nudged[0, 0, 0] = np.nextafter(np.float32(0.1), np.float32(1.0))  # float16 stores both as one value
    assert np.array_equal(w.astype(np.float16), nudged.astype(np.float16))
    first, second = _fp(weights=w), _fp(weights=nudged)
    assert first != second
    assert _fp(weights=w) == first  # deterministic
    # weights float16 holds exactly keep the fingerprint they had (no tap-sum entry)
    exact = np.full((2, 3, 2), 0.25)
    run = resolve(pipeline_from_dict({"conv": [{"weights": exact}]}), NAMES3).as_run()
    assert "tap_sums_sha256" not in run["stages"][0]
    rounded = resolve(pipeline_from_dict({"conv": [{"weights": w}]}), NAMES3)
    assert "tap_sums_sha256" in rounded.as_run()["stages"][0]
    assert "tap_sums_sha256" not in rounded.as_run(with_sums=False)["stages"][0]  # outputs written before
    # only the first stage on levels uses them: after a bank, or on z-scores, the same outputs, the same print
    after_bank = {"conv": [{"filters": ["ma:4"]}, {"weights": np.full((2, 3, 2), 0.1)}]}
    on_zscores = {"preprocess": {"zscore": 8}, "conv": [{"weights": w}]}
    for pipe in (after_bank, on_zscores):
        plan = resolve(pipeline_from_dict(pipe), NAMES3)
        assert not plan.first_on_levels
        assert all("tap_sums_sha256" not in st for st in plan.as_run()["stages"])


@pytest.mark.parametrize("again", ["ma:4", " ma:4", "ma:4 "])
def test_a_filter_listed_twice_is_refused(again: str) -> None:
    # with a space it had passed, and two columns of one name made the output unreadable to tsconv itself
    with pytest.raises(PipelineError, match="listed more than once: ma:4"):
        pipeline_from_dict({"conv": [{"filters": ["ma:4", "diff:1", again]}]})


@pytest.mark.parametrize(
    ("first", "again"), [("ma:16", "ma:016"), ("diff:1", "diff:01"), ("ema:8", "ema:8:67")]
)
def test_one_filter_written_two_ways_is_refused(first: str, again: str) -> None:
    # each had computed the same column twice under two names
    with pytest.raises(
        PipelineError, match=f"listed more than once: {min(first, again)}, {max(first, again)}"
    ):
        pipeline_from_dict({"conv": [{"filters": [first, "lag:2", again]}]})
    pipeline_from_dict({"conv": [{"filters": ["ema:8", "ema:8:66"]}]})  # another window: another filter


def test_bias_key_without_a_safetensors_bias_is_refused() -> None:
    with pytest.raises(PipelineError, match="bias_key applies only when bias is a .safetensors file"):
        pipeline_from_dict({"conv": [{"weights": np.ones((1, 1, 2)), "bias_key": "b"}]})


def test_a_receptive_field_too_long_to_carry_is_refused() -> None:
    stages = [{"filters": ["diff:1000"], "dilation": 1 << 20}] * 20
    with pytest.raises(PipelineError, match="receptive field spans"):
        resolve(pipeline_from_dict({"conv": stages}), NAMES3)


def test_loading_time_ranges_in_threads_leaves_the_warning_filters_as_they_were() -> None:
    """A time_range was parsed inside warnings.catch_warnings() with every warning an error: the filters are
    the process's, so two threads loading pipelines at once could restore each other's and leave every later
    warning an error (a TsconvWarning then raised out of features()); 'now' and 'today' read the clock."""
    import sys
    import threading

    from tsconv.pipeline.spec import pipeline_from_dict

    data = {
        "preprocess": {"time_range": ["2026-01-02T09:30:00+05:00", "2026-01-03"]},
        "conv": [{"filters": ["diff:1"]}],
    }
    before = list(warnings.filters)

    def load() -> None:
        for _ in range(1500):
            pipeline_from_dict(data)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a thread switch at nearly every bytecode: the race shows in one run
    try:
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert warnings.filters == before
    for clock in ("now", "today"):
        with pytest.raises(PipelineError, match="not a recognised ISO timestamp"):
            pipeline_from_dict(
                {"preprocess": {"time_range": ["2026-01-02", clock]}, "conv": [{"filters": ["diff:1"]}]}
            )
