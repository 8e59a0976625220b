"""tsconv.nn: CausalConv1d against a float64 F.conv1d on left-padded input, Pipeline against features(), both
under torch.compile (fullgraph, no break) and with the errors a caller can act on.

Without a GPU, CausalConv1d's kernels run through the Triton interpreter (tests/conftest.py), so shapes are
small; the Pipeline module runs the engine's CPU compute step, as features() does.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tsconv
from tsconv.errors import PipelineError, ShapeError, TsconvError
from tsconv.kernels.conv1d_reference import relative_error
from tsconv.kernels.torch_side import apply_activation
from tsconv.nn import CausalConv1d, Pipeline

from .helpers import mostly_slow, price_series

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# features() on the CPU computes a series of up to this many steps as one chunk, as the module does
FEATURES_CHUNK = 65536


def _reference(m: CausalConv1d, x: torch.Tensor) -> torch.Tensor:
    """act(F.conv1d(F.pad(x, (halo, 0)), w, b)) in float64 on the module's stored weights."""
    x64 = F.pad(x.double().cpu(), (m.halo, 0))
    b = None if m.bias is None else m.bias.double().cpu()
    y = F.conv1d(x64, m.weight.double().cpu(), b, dilation=m.dilation, groups=m.groups)
    return apply_activation(y, m.activation)


def _nan_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN (features' warm-up rows)."""
    return (
        a.shape == b.shape
        and bool(torch.equal(torch.isnan(a), torch.isnan(b)))
        and torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
    )


# -------------------------------------------------------------------------------------------- CausalConv1d


@pytest.mark.parametrize(("c", "o", "groups"), [(4, 8, 4), (3, 5, 1), (16, 16, 1)])
def test_weights_written_through_data_are_the_ones_used(c: int, o: int, groups: int) -> None:
    # the kernels' cache of rearranged weights is keyed by torch's version counter, which a write through
    # .data does not bump: the old filter's outputs came back (errors of 1.4 to 21)
    torch.manual_seed(0)
    m = CausalConv1d(c, o, 3, groups=groups, device=DEVICE)
    x = torch.randn(2, c, 40, device=DEVICE)
    m(x)
    m.weight.data.mul_(2.0)
    m.weight.data[0] = 0.5
    torch.testing.assert_close(m(x).cpu(), _reference(m, x).float(), rtol=1e-5, atol=1e-5)
    m.weight.data.copy_(torch.randn_like(m.weight))
    torch.testing.assert_close(m(x).cpu(), _reference(m, x).float(), rtol=1e-5, atol=1e-5)


def test_weight_dtype_follows_the_modules_casts() -> None:
    m = CausalConv1d(2, 2, 2)
    assert m.weight_dtype == "float16" and m.float().weight_dtype == "float32" and "float32" in repr(m)
    assert m.half().weight_dtype == "float16"
    assert m.bfloat16()(torch.ones(1, 2, 4)).dtype == torch.float32 and m.weight_dtype == "bfloat16"
    with pytest.raises(ShapeError, match="this module's weights are float64") as err:
        m.double()(torch.zeros(1, 2, 4))
    assert ".float()" in err.value.hint


def test_pipeline_input_names_are_an_ordered_list() -> None:
    # "MSFT" was read as the four features M, S, F, T
    with pytest.raises(ShapeError, match="input_names must be an ordered list"):
        Pipeline.from_pipeline("default", "MSFT")
    assert Pipeline.from_pipeline("default", np.array(["MSFT", "AAPL"])).n_features == 2


def test_a_state_dict_past_float16_is_refused_not_stored_as_inf() -> None:
    plain = torch.nn.Conv1d(2, 2, 2)
    with torch.no_grad():
        plain.weight.fill_(1e5)
    m = CausalConv1d(2, 2, 2)
    with pytest.raises(ShapeError, match="a weight of 1e\\+05 does not fit this module's float16 weights"):
        m.load_state_dict(plain.state_dict())
    assert torch.isfinite(m.weight).all()
    wide = CausalConv1d(2, 2, 2, weight_dtype="float32")
    wide.load_state_dict(plain.state_dict())
    assert float(wide.weight.max()) == 1e5
    m.load_state_dict(plain.state_dict(), assign=True)  # keeps the given float32 tensor
    assert m.weight.dtype == torch.float32 and float(m.weight.max()) == 1e5
    with torch.no_grad():
        plain.weight.fill_(65510.0)  # rounds to float16's largest, 65504
    fits = CausalConv1d(2, 2, 2)
    fits.load_state_dict(plain.state_dict())
    assert float(fits.weight.max()) == 65504.0


@pytest.mark.parametrize(
    ("c", "o", "k", "dilation", "groups", "bias", "activation", "weight_dtype"),
    [
        (4, 8, 3, 2, 4, True, "relu", "float16"),  # a depthwise bank of 2 filters per channel, dilated
        (6, 4, 4, 1, 2, False, "tanh", "float32"),  # grouped
        (3, 5, 5, 3, 1, True, "gelu", "float16"),  # dense, few channels: the direct kernel
        (16, 16, 2, 1, 1, True, "none", "float32"),  # dense, 16 x 16: the implicit GEMM
    ],
)
def test_causal_conv1d_equals_float64_conv_on_left_padded_input(
    c, o, k, dilation, groups, bias, activation, weight_dtype
):
    torch.manual_seed(0)
    m = CausalConv1d(c, o, k, dilation=dilation, groups=groups, bias=bias, activation=activation,
                     weight_dtype=weight_dtype, device=DEVICE)  # fmt: skip
    assert m.weight.dtype == getattr(torch, weight_dtype)
    x = torch.randn(2, c, 24, device=DEVICE)
    y = m(x)
    assert y.shape == (2, o, 24) and y.dtype == torch.float32
    assert relative_error(y.cpu(), _reference(m, x)) < 1e-6
    # causal: changing the last steps moves only the last outputs
    x2 = x.clone()
    x2[..., 20:] += 5.0
    assert torch.equal(m(x2)[..., :20], y[..., :20])
    # one series [C, T] -> [O, T]
    assert torch.equal(m(x[0]), y[0])


def test_from_weights_keeps_given_values_unless_asked_to_round():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 1, 3, generator=g, dtype=torch.float64)
    b = torch.randn(6, generator=g)
    m = CausalConv1d.from_weights(w.float(), b, groups=3, activation="relu", dilation=2)
    assert (m.in_channels, m.out_channels, m.kernel_size, m.weight_dtype) == (3, 6, 3, "float32")
    assert torch.equal(m.weight, w.float()) and torch.equal(m.bias, b)
    h = CausalConv1d.from_weights(w.numpy(), groups=3, weight_dtype="float16")
    assert h.weight.dtype == torch.float16 and h.bias is None
    assert torch.equal(h.weight, w.half())
    assert CausalConv1d.from_weights(w.half(), groups=3).weight_dtype == "float16"
    with pytest.raises(ShapeError, match="does not fit float16"):
        CausalConv1d.from_weights(w * 1e6, groups=3, weight_dtype="float16")
    with pytest.raises(ShapeError, match=r"bias must be \[O\] = \[6\]"):
        CausalConv1d.from_weights(w, torch.zeros(5), groups=3)
    # the state_dict round trip of a torch module
    m2 = CausalConv1d(3, 6, 3, groups=3, dilation=2, activation="relu", weight_dtype="float32")
    m2.load_state_dict(m.state_dict())
    x = torch.randn(1, 3, 10, generator=g)
    assert torch.equal(m2(x), m(x))


def test_causal_conv1d_gives_shape_errors_with_hints():
    m = CausalConv1d(3, 6, 2, groups=3)
    with pytest.raises(ShapeError, match=r"expects 3 channels in dim 1 \(\[B, C, T\].*transpose\(1, 2\)"):
        m(torch.zeros(2, 10, 3))  # time-major [B, T, C]
    with pytest.raises(ShapeError, match=r"expects \[B, C, T\].*got shape \[10\]"):
        m(torch.zeros(10))
    with pytest.raises(ShapeError, match="float32, float16 or bfloat16"):
        m(torch.zeros(1, 3, 10, dtype=torch.float64))
    with pytest.raises(ShapeError, match="groups=2 must divide"):
        CausalConv1d(3, 6, 2, groups=2)
    with pytest.raises(ShapeError, match="precision must be one of"):
        CausalConv1d(3, 6, 2, precision="fp64")
    with pytest.raises(ShapeError, match="kernel_size must be a positive int"):
        CausalConv1d(3, 6, 0)


def test_causal_conv1d_refuses_gradients_and_runs_without_them():
    m = CausalConv1d(2, 2, 3)
    x = torch.randn(1, 2, 8, requires_grad=True)
    with pytest.raises(TsconvError, match="inference-only.*no backward"):
        m(x)
    with torch.no_grad():
        y = m(x)
    assert not y.requires_grad
    m.weight.requires_grad_(True)
    with pytest.raises(TsconvError, match="inference-only"):
        m(x.detach())


def test_causal_conv1d_compiles_fullgraph_with_the_eager_values():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        CausalConv1d(4, 8, 3, groups=4, dilation=2, activation="relu", device=DEVICE),
        CausalConv1d(8, 4, 2, activation="tanh", weight_dtype="float32", device=DEVICE),
    )
    x = torch.randn(2, 4, 16, device=DEVICE)
    expected = model(x)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()  # aot_eager: dynamo's graph run through AOT autograd, the ops' fakes included
    assert torch.equal(torch.compile(model, backend="aot_eager", fullgraph=True)(x), expected)


# ----------------------------------------------------------------------------------------------- Pipeline

# (pipeline, input names): the built-ins and dict pipelines that exercise fill = "none" and a selection
PIPELINES = [
    ("default", None),
    ("trend_ema", None),
    ("multiscale", None),
    ("dense_head", [f"x{j}" for j in range(64)]),  # a dense stage, then the head
    ("returns_zscore", ["px_a", "qty", "px_b"]),  # [preprocess]: selection, log returns, z-score
    ({"preprocess": {"fill": "none"}, "conv": [{"filters": ["diff:1", "ema:8"]}]}, None),
]


def _series(names: list[str] | None, rows: int = 1500, seed: int = 0) -> torch.Tensor:
    x = price_series(rows, len(names) if names else 3, seed=seed, nan_fraction=0.02)
    x[:40, 0] = np.nan  # a feature that starts late
    return torch.from_numpy(x)


@pytest.mark.parametrize(("pipeline", "names"), PIPELINES)
def test_pipeline_module_equals_features(pipeline, names):
    """On the CPU a series within features()' chunk is computed by the same steps: equal bit for bit."""
    x = _series(names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tsconv.TsconvWarning)  # FP16 storage notes, given by both
        expected, cols = tsconv.features(x, pipeline, names=names, return_names=True)
        if names is None:
            m = Pipeline.from_pipeline(pipeline, n_features=x.shape[1])
        else:
            m = Pipeline.from_pipeline(pipeline, names)
        got = m(x)
    assert m.output_names == cols
    assert _nan_equal(got, expected)
    # a batch [B, T, F]: each series on its own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tsconv.TsconvWarning)
        batch = m(torch.stack([x, x.flip(0)]))
    assert _nan_equal(batch[0], expected)


@pytest.mark.parametrize("dtype", ["float64", "int64"])
@pytest.mark.parametrize(("pipeline", "names"), [PIPELINES[0], PIPELINES[3], PIPELINES[4]])
def test_pipeline_module_reads_wide_rows_as_features_does(pipeline, names, dtype):
    """float64 prices and int64 ticks near 1e9: read as float64 on the CPU, as features() reads them (rounded
    to float32 first, a one-step difference of ticks was up to 63 off, 7.6e-6 on float64 prices near 100)."""
    x = _series(names).numpy().astype(np.float64)
    if dtype == "int64":
        x = np.nan_to_num(1e9 + np.round(x * 100), nan=1e9).astype(np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tsconv.TsconvWarning)
        expected = torch.from_numpy(tsconv.features(x, pipeline, names=names))
        m = (
            Pipeline.from_pipeline(pipeline, names)
            if names
            else Pipeline.from_pipeline(pipeline, n_features=3)
        )
        got = m(torch.from_numpy(x))
    assert _nan_equal(got, expected)


def test_pipeline_module_warmup_zero_equals_features():
    x = _series(None, rows=300)
    m = Pipeline.from_pipeline("default", ["a", "b", "c"], warmup="zero")
    expected = tsconv.features(x, "default", names=["a", "b", "c"], warmup="zero")
    assert _nan_equal(m(x), expected)


@pytest.mark.parametrize("pipeline", ["default", "trend_ema"])
def test_pipeline_module_on_a_long_series_is_within_fp32_rounding_of_features(pipeline):
    """features() centres each chunk on its own level and the module the whole series on one, so a series
    longer than a chunk differs by float32 rounding only. Each is within about 1.3e-6 of the float64 result
    relative to each output's scale (README, Precision), so they differ by under 2.6e-6; measured here:
    3.8e-7 (default) and 8.7e-8 (trend_ema) with 64-step chunks."""
    x = _series(None, rows=3000, seed=1)
    m = Pipeline.from_pipeline(pipeline, n_features=3)
    got = m(x).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tsconv.TsconvWarning)
        expected = tsconv.features(x, pipeline, chunk=64).double()
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    scale = expected.nan_to_num().abs().amax(dim=0)
    rel = ((got - expected).nan_to_num().abs() / scale).max().item()
    assert rel < 4e-6


@pytest.mark.parametrize(
    ("pipeline", "names"), mostly_slow([PIPELINES[1], PIPELINES[3], PIPELINES[4]], fast={0})
)
def test_pipeline_module_compiles_fullgraph_with_the_eager_values(pipeline, names):
    x = _series(names, rows=600)
    n = x.shape[1]
    m = Pipeline.from_pipeline(pipeline, names) if names else Pipeline.from_pipeline(pipeline, n_features=n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tsconv.TsconvWarning)
        expected = m(x)
    torch._dynamo.reset()
    assert torch._dynamo.explain(m)(x).graph_break_count == 0
    torch._dynamo.reset()
    assert _nan_equal(torch.compile(m, backend="aot_eager", fullgraph=True)(x), expected)


def test_pipeline_module_gives_errors_with_hints():
    m = Pipeline.from_pipeline("default", n_features=3)
    assert m.halo == 256 and len(m.output_names) == 15
    with pytest.raises(ShapeError, match=r"built for 3 features \(the last dim\), got shape \[3, 600\]"):
        m(torch.zeros(3, 600))  # feature-major
    with pytest.raises(ShapeError, match=r"time-major series \[T, F\] or a batch"):
        m(torch.zeros(600))
    with pytest.raises(
        ShapeError, match="shortest warm-up is 1 steps, so every output would be NaN.*warmup='zero'"
    ):
        m(torch.zeros(1, 3))
    # shorter than the longest warm-up: diff:1 has values, as features() gives them
    x = torch.from_numpy(price_series(100, 3, seed=2))
    assert _nan_equal(m(x), torch.from_numpy(tsconv.features(x.numpy(), "default")))
    with pytest.raises(TsconvError, match="inference-only"):
        m(torch.zeros(600, 3, requires_grad=True))
    with pytest.raises(PipelineError, match="input_names or n_features"):
        Pipeline.from_pipeline("default")
    with pytest.raises(PipelineError, match="neither a pipeline file nor a built-in"):
        Pipeline.from_pipeline("no_such_pipeline", n_features=3)
    resolved = m.plan
    assert Pipeline.from_pipeline(resolved).output_names == m.output_names
    with pytest.raises(PipelineError, match="already bound"):
        Pipeline.from_pipeline(resolved, n_features=3)


def test_import_tsconv_leaves_nn_unimported_until_used():
    code = (
        "import sys, tsconv; assert 'tsconv.nn' not in sys.modules and 'torch' not in sys.modules; "
        "tsconv.nn.CausalConv1d; assert 'tsconv.nn' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_causal_conv1d_on_cuda_against_float64_at_a_realistic_size():
    """The Triton kernels behind the module at engine-like sizes: a dense 256 -> 256 stage (implicit GEMM)
    and a depthwise bank of 4 filters over 1024 channels, fp32-accurate against float64, eager and compiled."""
    torch.manual_seed(0)
    cases = [
        (CausalConv1d(256, 256, 5, activation="gelu", device="cuda"), 256),
        (CausalConv1d(1024, 4096, 64, groups=1024, dilation=2, device="cuda"), 1024),
    ]
    for m, c in cases:
        x = 100 + torch.randn(4, c, 4096, device="cuda").cumsum(-1) * 0.01  # price-like levels
        y = m(x)
        assert relative_error(y.cpu(), _reference(m, x)) < 1e-6
        torch._dynamo.reset()
        assert torch.equal(torch.compile(m, backend="aot_eager", fullgraph=True)(x), y)


@pytest.mark.gpu
@pytest.mark.parametrize(("pipeline", "names"), [PIPELINES[0], PIPELINES[3]])
def test_pipeline_module_on_cuda_is_within_fp32_rounding_of_features(pipeline, names):
    x = _series(names, rows=20000)
    m = Pipeline.from_pipeline(pipeline, names, n_features=None if names else 3, device="cuda")
    got = m(x.cuda()).double().cpu()
    expected = tsconv.features(x, pipeline, names=names, device="cuda").double()
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    scale = expected.nan_to_num().abs().amax(dim=0)
    assert ((got - expected).nan_to_num().abs() / scale).max().item() < 4e-6
    torch._dynamo.reset()
    assert _nan_equal(torch.compile(m, backend="aot_eager", fullgraph=True)(x.cuda()).cpu(), got.float())


def test_pipeline_module_warns_where_its_backend_rounds_wide_rows_to_float32():
    """Where the backend reads float32 (CUDA's), float64 prices are rounded on read: the module warns, naming
    the feature, as features() and tsconv process do (it was silent); float32 input gives no warning."""
    rng = np.random.default_rng(3)
    x = 400.0 + np.cumsum(rng.integers(-1, 2, size=(3000, 2)), axis=0) * 0.01 + 1e-9
    x[:1500, 1] = np.nan  # a symbol that starts late is judged on its own first rows
    m = Pipeline.from_pipeline("default", ["AAA", "BBB"])
    m._backend.reads_float64 = False  # the CUDA backend's read (a CPU test cannot build that backend)
    with pytest.warns(tsconv.TsconvWarning, match="'AAA'.*float32"):
        m(torch.from_numpy(x))
    quiet = Pipeline.from_pipeline("default", ["AAA", "BBB"])
    quiet._backend.reads_float64 = False
    with warnings.catch_warnings():
        warnings.simplefilter("error", tsconv.TsconvWarning)
        quiet(torch.from_numpy(x.astype(np.float32)))


def test_a_pipeline_with_a_time_range_is_refused_as_features_refuses_it():
    # it was accepted, and every row returned: the span was silently ignored
    pipe = {"preprocess": {"time_range": ["2026-01-01", "2026-01-02"]}, "conv": [{"filters": ["diff:1"]}]}
    with pytest.raises(TsconvError, match=r"time_range is not supported by tsconv.nn.Pipeline"):
        Pipeline.from_pipeline(pipe, n_features=2)


def test_a_pipeline_module_on_an_empty_batch_gives_an_empty_batch() -> None:
    # torch.stack of no series raised "stack expects a non-empty TensorList"
    model = tsconv.nn.Pipeline.from_pipeline({"conv": [{"filters": ["diff:1", "ma:4"]}]}, n_features=3)
    y = model(torch.zeros(0, 20, 3))
    assert y.shape == (0, 20, 6) and y.dtype == torch.float32


def test_a_module_of_a_resolved_pipeline_with_a_selection_checks_the_width() -> None:
    # rebuilt from a resolved pipeline that selects some features, the module did not know the source's width:
    # 6 columns passed where 4 were resolved against ran on columns 1 and 3 under the names px_a and px_b
    names = ["vol_a", "px_a", "vol_b", "px_b"]
    m = Pipeline.from_pipeline("returns_zscore", input_names=names)
    again = Pipeline.from_pipeline(m.plan)
    assert again.n_features == m.n_features == 4
    x = torch.from_numpy(price_series(600, 4, seed=5))
    torch.testing.assert_close(again(x), m(x), rtol=0, atol=0, equal_nan=True)
    wider = torch.cat([torch.ones(600, 2), x], dim=1)
    with pytest.raises(ShapeError, match="built for 4 features"):
        again(wider)


@pytest.mark.parametrize("pipeline", ["default", "returns_zscore"])
@pytest.mark.parametrize("n_features", [3, 6])
def test_a_module_given_another_width_than_its_pipeline_was_resolved_against_is_refused(pipeline, n_features):
    # Pipeline(plan, n_features=6) for a plan resolved against 4 features ran on 6 columns: 30 outputs under the
    # plan's 20 names (without a selection), or the selected columns by position of another width
    names = ["vol_a", "px_a", "vol_b", "px_b"]
    plan = Pipeline.from_pipeline(pipeline, input_names=names).plan
    assert Pipeline(plan, n_features=4).n_features == 4
    with pytest.raises(PipelineError, match=f"resolved against 4 features, not n_features={n_features}"):
        Pipeline(plan, n_features=n_features)
