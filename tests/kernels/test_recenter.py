"""conv1d's ``recenter`` option on every kernel path (Triton interpreter on CPU tensors, real kernels on a GPU).

Raw levels far from zero through zero-sum filters lose digits in float32: the error scales with the level
(or with the drift from a stale centering level), not with the moves the filters measure. ``recenter=True``
subtracts, per block of outputs, each channel's value at the block's first input row and adds it back times
the filter's tap sum; these tests pin that it (1) keeps the results of non-zero-sum filters (the add-back),
(2) removes the level's share of the error, and (3) leaves NaN and inf reaching exactly the outputs they
reached before.
"""

from __future__ import annotations

import math

import pytest
import torch

from tsconv.errors import ShapeError
from tsconv.kernels import autotune, torch_side
from tsconv.kernels import conv1d as conv1d_mod
from tsconv.kernels import fused as fused_mod
from tsconv.kernels.conv1d import api as conv_api
from tsconv.kernels.conv1d import spec as conv_spec
from tsconv.kernels.conv1d_reference import conv1d_reference, relative_error, torch_conv1d_in_precision

from ..helpers import mostly_slow
from .test_conv1d import ATOL, DEVICE, FP32_FACTOR, _gen, nan_out, zero_sum_weights

# path -> (groups per C, filters per group or dense O, the config; None: the space's default / interpreter one)
_PATHS = {
    "dense": (1, 24, None),
    "direct": ("C", 3, {"BLOCK_T": 16, "BLOCK_G": 8, "UNROLL": 2}),
    "grouped_direct": ("C/2", 3, {"BLOCK_T": 16, "BLOCK_G": 8, "UNROLL": 1}),
    "bank": ("C", 3, {"BANK": 1, "BLOCK_T": 16, "BLOCK_G": 8, "T_ITERS": 2, "UNROLL": 2}),
    "window": ("C", 3, {"WINDOW": 1, "ROWS": 4, "TAPS": 3, "BLOCK_G": 32}),
}


def far_levels(N: int, L: int, C: int, seed: int = 0, level: float = 4096.0) -> torch.Tensor:
    """A time-major [N, L, C] buffer of random walks (0.01 steps) around ``level``: float32 resolves only
    about 5e-4 there, so a 0.01 move is 20 units in the last place."""
    steps = 0.01 * torch.randn(N, L, C, generator=_gen(seed), dtype=torch.float64)
    return (level + steps.cumsum(1)).to(torch.float32).to(DEVICE)


def _case(path: str, C: int, K: int, *, zero_sum: bool = True, seed: int = 7, wdtype=torch.float32):
    g_spec, per, meta = _PATHS[path]
    groups = {1: 1, "C": C, "C/2": C // 2}[g_spec]
    O = per if groups == 1 else groups * per
    Cg = C // groups
    if zero_sum:
        w = zero_sum_weights(O, Cg, K, seed=seed, dtype=wdtype)
    else:  # moving averages: tap sum 1 per output, so the add-back carries the whole level
        w = torch.full((O, Cg, K), 1.0 / (Cg * K), dtype=torch.float32, device=DEVICE)
    cfg = None if meta is None else autotune.Config(path, meta, 4 if path != "window" else 1, 1)
    return groups, w, cfg


def _run(x, w, b, *, groups, cfg, recenter, path, fallback=None, **kw):
    spec = conv_spec.validate(x, w, b, None, groups=groups, precision="fp32", recenter=recenter, **kw)
    out = nan_out(x.shape[0], w.shape[0], spec.L_out)
    conv_api._conv1d_triton(x, w, b, out, spec, config=cfg, fallback=fallback)
    expected = {"grouped_direct": "direct"}.get(path, path)
    assert conv1d_mod.last_launch["path"] == expected
    return out


@pytest.mark.parametrize("path", mostly_slow(list(_PATHS), fast=(0, 4)))
@pytest.mark.parametrize(("K", "dilation", "padding"), [(5, 1, "causal"), (4, 3, "valid")])
def test_recenter_removes_the_levels_error(path: str, K: int, dilation: int, padding: str) -> None:
    """Zero-sum filters on levels near 4096: the error falls by more than 10x and meets the fp32 bound. The
    window kernel's blocks are 4 rows: 36 steps give it 9 a series (interpreted, its time goes with the rows)."""
    C, L = 16, 36 if path == "window" else 70
    x = far_levels(2, L, C, seed=1).transpose(1, 2)
    groups, w, cfg = _case(path, C, K)
    b = torch.randn(w.shape[0], generator=_gen(3)).to(DEVICE) * 0.01
    kw = dict(dilation=dilation, padding=padding, activation="tanh")
    ref = conv1d_reference(x, w, b, groups=groups, **kw)
    plain = _run(x, w, b, groups=groups, cfg=cfg, recenter=False, path=path, **kw)
    centered = _run(x, w, b, groups=groups, cfg=cfg, recenter=True, path=path, **kw)
    assert not torch.isnan(centered).any(), "some outputs were not written"
    err_plain, err = relative_error(plain, ref), relative_error(centered, ref)
    assert err * 10 < err_plain, f"recentered {err:.2e} vs plain {err_plain:.2e}"
    err_torch = relative_error(torch_conv1d_in_precision(x, w, b, groups=groups, precision="fp32", **kw), ref)
    assert err <= FP32_FACTOR * err_torch + ATOL["fp32"]


@pytest.mark.parametrize("path", list(_PATHS))
def test_recenter_adds_the_level_back(path: str) -> None:
    """Moving averages (tap sum 1) on levels: the output is the level itself, so a missing or misplaced
    add-back (it goes before the bias and the activation) would be off by thousands."""
    C, L, K = 16, 50, 6
    x = far_levels(1, L, C, seed=2).transpose(1, 2)
    groups, w, cfg = _case(path, C, K, zero_sum=False)
    b = torch.full((w.shape[0],), -4096.0, device=DEVICE)  # relu(level - 4096): needs the add-back first
    kw = dict(dilation=2, padding="causal", activation="relu")
    ref = conv1d_reference(x, w, b, groups=groups, **kw)
    out = _run(x, w, b, groups=groups, cfg=cfg, recenter=True, path=path, **kw)
    err_torch = relative_error(torch_conv1d_in_precision(x, w, b, groups=groups, precision="fp32", **kw), ref)
    # the causal history's zeros make early outputs ~ -4096 before the relu: the scale of the check
    assert (out.double() - ref).abs().max().item() <= 4096 * (FP32_FACTOR * err_torch + 1e-6)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("path", list(_PATHS))
def test_recenter_keeps_nan_and_inf_where_they_were(path: str) -> None:
    """NaN and inf at block starts (where the level is read), at step 0 and elsewhere reach exactly the
    outputs the reference says: a non-finite level is skipped, never spread over its block."""
    C, L, K = 16, 64, 3
    buf = far_levels(1, L, C, seed=5)
    for t in (0, 14, 16, 30, 47):
        buf[0, t, 3] = math.nan
    for t in (0, 16, 33):
        buf[0, t, 9] = math.inf
    buf[0, 20, 9] = -math.inf
    x = buf.transpose(1, 2)
    # float16 weights: the dense fp32 kernel's float32-weight split multiplies x by the weights' TF32 low
    # part, and inf times a zero low part is NaN with or without recentering (benchmarks/NOTES.md,
    # "Precision")
    groups, w, cfg = _case(path, C, K, wdtype=torch.float16)
    for padding in ("causal", "valid"):
        kw = dict(dilation=1, padding=padding, activation=None)
        ref = conv1d_reference(x, w, None, groups=groups, **kw)
        out = _run(x, w, None, groups=groups, cfg=cfg, recenter=True, path=path, **kw)
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), padding
        assert torch.equal(torch.isinf(out), torch.isinf(ref)), padding
        finite = torch.isfinite(ref)
        assert torch.allclose(out[finite].double(), ref[finite], rtol=0, atol=1e-3)


def test_recenter_fused_head() -> None:
    """The fused conv -> head kernel recenters its conv tile the same way (interpreted or on a GPU)."""
    if not (DEVICE.type == "cuda" or torch_side.INTERPRETED):
        pytest.skip("the fused kernel runs on a GPU or in the interpreter")
    C, L, K, O, D = 16, 60, 4, 32, 8
    x = far_levels(2, L, C, seed=6).transpose(1, 2)
    w = zero_sum_weights(O, C, K, dtype=torch.float32)
    hw = torch.randn(O, D, generator=_gen(8)).to(DEVICE) / 4
    outs = {}
    for rc in (False, True):
        cfg = autotune.Config("f", {"BLOCK_T": 32, "BLOCK_O": 32, "BLOCK_C": 16}, 4, 1)
        spec = fused_mod._validate(
            x, w, None, hw, None, None, dilation=2, groups=1, padding="valid", activation="gelu",
            head_activation=None, precision="fp32", recenter=rc,
        )  # fmt: skip
        out = torch.full((2, spec.conv.L_out, D), math.nan, device=DEVICE)
        fused_mod._fused_triton(x, w, None, hw, None, out, spec, config=cfg)
        outs[rc] = out
    conv = conv1d_reference(x, w, None, dilation=2, padding="valid", activation="gelu")
    ref = conv.transpose(1, 2) @ hw.double()
    err_plain, err = relative_error(outs[False], ref), relative_error(outs[True], ref)
    assert err * 10 < err_plain, f"recentered {err:.2e} vs plain {err_plain:.2e}"


def test_recenter_validation() -> None:
    x = far_levels(1, 20, 4).transpose(1, 2)
    w = zero_sum_weights(4, 1, 3)
    with pytest.raises(ShapeError, match="recenter must be True or False"):
        conv1d_mod.conv1d(x, w, groups=4, recenter="yes")
    with pytest.raises(ShapeError, match="precision='fp32'"):
        conv1d_mod.conv1d(x, w, groups=4, recenter=True, precision="tf32")
    with pytest.raises(ShapeError, match="recenter_from must be >= 0"):
        conv1d_mod.conv1d(x, w, groups=4, recenter=True, recenter_from=-1)
    level = torch.full((4,), 4096.0, device=DEVICE)
    with pytest.raises(ShapeError, match="recenter_fallback is for recenter=True"):
        conv1d_mod.conv1d(x, w, groups=4, recenter_fallback=level)
    with pytest.raises(ShapeError, match=r"shape \[4\] on .*, got \(3,\)"):
        conv1d_mod.conv1d(x, w, groups=4, recenter=True, recenter_fallback=level[:3])
    with pytest.raises(ShapeError, match="float32"):
        conv1d_mod.conv1d(x, w, groups=4, recenter=True, recenter_fallback=level.double())


@pytest.mark.parametrize("path", mostly_slow(list(_PATHS), fast=(0, 1, 4)))
def test_recenter_fallback_centres_the_block_where_a_series_starts(path: str) -> None:
    """A channel whose samples at a block's start are NaN (its series starts inside the block) takes the
    caller's level for it: without one it took 0, and the block's outputs were computed on raw levels near
    4096 (float32 resolves 5e-4 there, against 0.01 moves)."""
    C, L, start = 16, 36 if path == "window" else 70, 21  # 21: inside a block of every path's tiles
    x = far_levels(1, L, C, seed=2)
    x[0, :start, 3] = float("nan")
    x = x.transpose(1, 2)  # [1, C, L] view of the time-major buffer
    groups, w, cfg = _case(path, C, 3)
    ref = conv1d_reference(x, w, None, groups=groups)
    level = x[0, :, start].contiguous()  # each channel's value where channel 3 starts
    kw = dict(dilation=1, padding="causal", activation=None)
    plain = _run(x, w, None, groups=groups, cfg=cfg, recenter=True, path=path, **kw)
    fell_back = _run(x, w, None, groups=groups, cfg=cfg, recenter=True, path=path, fallback=level, **kw)
    listed = ref[..., start + 2 :]  # outputs whose taps read channel 3's prices only
    assert torch.equal(torch.isnan(fell_back), torch.isnan(ref))
    err = relative_error(fell_back[..., start + 2 :], listed)
    err_plain = relative_error(plain[..., start + 2 :], listed)
    assert err * 10 < err_plain, f"with the fallback {err:.2e}, on 0 {err_plain:.2e}"
    assert err < 1e-5, err


def _spiky(L: int, C: int, spikes: tuple[int, ...], seed: int = 9) -> torch.Tensor:
    """A [1, C, L] view of volume-like data: around 100 (+-10), with prints of 1e5 at ``spikes``."""
    v = 100.0 + 10.0 * torch.rand(1, L, C, generator=_gen(seed), dtype=torch.float64)
    v[0, list(spikes), :] = 1e5
    return v.to(torch.float32).to(DEVICE).transpose(1, 2)


@pytest.mark.parametrize("burst", [1, 2])
@pytest.mark.parametrize("path", mostly_slow(list(_PATHS), fast=(0, 4)))
def test_bad_prints_at_a_blocks_level_step_are_not_its_level(path: str, burst: int) -> None:
    """Prints of 1e5, one or two in a row ending at steps 48, 64, ..., 192 (block starts for 16-, 32- and 64-row
    tiles; for 4-row windows too): a level read there would put every other output of the block 1e5 away from its data.
    Every kernel takes the median of five steps, so on the outputs whose taps miss the prints the recentered
    error stays within a few times the plain kernel's. The dense kernels read one step, and with zero-sum
    filters such a block was hundreds of times its outputs' scale off. The window kernel's blocks are 4 rows:
    its six ends are 8 steps apart, at 16, 24, ..., 56 (interpreted, its time goes with the rows)."""
    C, L, K = 16, 200, 2  # K = 2: in a 4-row window block starting at a print, two outputs miss it
    ends = (48, 64, 96, 128, 160, 192)
    if path == "window":
        L, ends = 64, (16, 24, 32, 40, 48, 56)
    spikes = tuple(e - j for e in ends for j in range(burst))
    x = _spiky(L, C, spikes)
    for zero_sum in (False, True):  # averages (the output is the volume's level) and zero-sum filters
        groups, w, cfg = _case(path, C, K, zero_sum=zero_sum)
        kw = dict(dilation=1, padding="causal", activation=None)
        ref = conv1d_reference(x, w, None, groups=groups, **kw)
        plain = _run(x, w, None, groups=groups, cfg=cfg, recenter=False, path=path, **kw)
        centered = _run(x, w, None, groups=groups, cfg=cfg, recenter=True, path=path, **kw)
        clean = torch.ones(L, dtype=torch.bool, device=DEVICE)  # outputs whose K taps miss every print
        for s in spikes:
            clean[s : s + K] = False
        err_plain = (plain.double() - ref).abs()[..., clean].max().item()
        err = (centered.double() - ref).abs()[..., clean].max().item()
        assert err <= 4 * err_plain + 1e-6, (
            f"zero_sum={zero_sum}: recentered {err:.2e} vs plain {err_plain:.2e}"
        )


@pytest.mark.parametrize("path", ["dense", "direct", "bank"])
def test_recenter_from_keeps_levels_out_of_the_zero_history(path: str) -> None:
    """The engine's first step: ``h`` rows of zero history (-level after its centering) before data near 0,
    in "valid" padding. The first 16-row block ends in data, but its level step is in the history; with
    ``recenter_from=h`` the level moves to the first data row and the data-only outputs stay exact."""
    C, K, h, L = 16, 4, 6, 70
    data = far_levels(1, L - h, C, seed=4, level=0.0)  # centered data: small walks around 0
    x = torch.cat([torch.full((1, h, C), -4096.0, device=DEVICE), data], dim=1).transpose(1, 2)
    groups, w, cfg = _case(path, C, K)
    kw = dict(dilation=1, padding="valid", activation=None)
    ref = conv1d_reference(x, w, None, groups=groups, **kw)
    errs = {}
    for start in (0, h):
        spec = conv_spec.validate(
            x, w, None, None, groups=groups, precision="fp32", recenter=True, recenter_from=start, **kw
        )
        out = nan_out(1, w.shape[0], spec.L_out)
        conv_api._conv1d_triton(x, w, None, out, spec, config=cfg)
        errs[start] = (out.double() - ref).abs()[..., h:].max().item()  # outputs that read data only
    assert errs[h] * 100 < errs[0], errs
    assert errs[h] <= 1e-6, errs
