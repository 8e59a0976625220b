"""tsconv.kernels.gemm against a float64 reference.

Without a GPU the Triton kernel runs through the interpreter (tests/conftest.py sets TRITON_INTERPRET=1), so
shapes are small and blocks large. Error rule (as in flash-attention's tests): the kernel's normwise error
against float64 must stay within a small multiple of torch's own error in the same precision class: on a
GPU cuBLAS (TF32 off / on, float16 operands); on the CPU float32 matmuls of the operands rounded as tensor
cores take them (TF32 / float16), which is what tensor cores compute: exact products, float32 accumulation.

The interpreter computes ``tl.dot`` in exact float32, which would hide what the three-way split is for; the
emulation tests route every tensor-core dot through ``conv1d_reference.tensor_core_dot`` (operands truncated
to TF32, round-toward-zero block accumulation, as measured on Hopper) to show the split and the per-block
flush keep "fp32" within float32 rounding, and that the older two-way split does not.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from tsconv.errors import ShapeError
from tsconv.kernels import autotune, torch_side
from tsconv.kernels import gemm as gemm_mod
from tsconv.kernels.conv1d_reference import (
    emulate_tensor_cores,
    relative_error,
    round_to_tf32,
    round_to_tf32_rne,
)
from tsconv.kernels.gemm import PackedWeights, gemm, gemm_space, pack_weights

from .sm90 import run_compile_script

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ATOL = {"fp32": 1e-7, "tf32": 1e-5, "fp16": 1e-5}
FACTOR = {"fp32": 4.0, "tf32": 2.0, "fp16": 2.0}


@pytest.fixture(autouse=True)
def _no_tuning(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """On a GPU tests use each space's default config and never touch the user's autotune cache."""
    monkeypatch.setenv("TSCONV_AUTOTUNE", "0")
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path / "autotune"))


# ---------------------------------------------------------------------------------------------- helpers


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def price_levels(M: int, K: int, seed: int = 0) -> torch.Tensor:
    """[M, K]: K features that are random walks around 100 (0.05 steps) over M time steps."""
    steps = 0.05 * torch.randn(M, K, generator=_gen(seed), dtype=torch.float64)
    level = 100.0 + 20.0 * torch.rand(1, K, generator=_gen(seed + 100), dtype=torch.float64)
    return (level + steps.cumsum(0)).float().to(DEVICE)


def returns(M: int, K: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(M, K, generator=_gen(seed)).to(DEVICE)


def zero_sum_b(K: int, N: int, seed: int = 1, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """[K, N] difference-like head columns: random weights summing to zero over K (before storage rounding)."""
    w = torch.randn(K, N, generator=_gen(seed), dtype=torch.float64)
    if K > 1:
        w -= w.mean(dim=0, keepdim=True)
    return (w / math.sqrt(K)).to(dtype).to(DEVICE)


def reference(a, b, bias=None, activation=None) -> torch.Tensor:
    y = a.double() @ b.double()
    if bias is not None:
        y = y + bias.double()
    return _act64(y, activation)


def _act64(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu":
        return torch.nn.functional.gelu(y)
    if activation == "tanh":
        return torch.tanh(y)
    return y


def torch_in_precision(a, b, bias=None, activation=None, precision="fp32") -> torch.Tensor:
    """torch's own product in the precision class (the yardstick), as float32."""
    if a.is_cuda:
        flag = torch.backends.cuda.matmul.allow_tf32
        try:
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            if precision == "fp16":
                y = (a.half() @ b.half()).float()
            else:
                y = a.float() @ b.float()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = flag
    elif precision == "fp32":
        y = a.float() @ b.float()
    elif precision == "tf32":
        y = round_to_tf32(a) @ round_to_tf32(b)
    else:
        y = a.half().float() @ b.half().float()
    if bias is not None:
        y = y + bias.float()
    return _act64(y, activation).float()


def nan_out(M: int, N: int, *, transposed: bool = False) -> torch.Tensor:
    if transposed:
        return torch.full((N, M), math.nan, device=DEVICE).T
    return torch.full((M, N), math.nan, device=DEVICE)


def check(a, b, bias=None, *, precision="fp32", activation=None, out=None, factor=None) -> float:
    """Run gemm into a NaN-poisoned ``out`` and apply the error rule; returns the kernel's error."""
    M, N = a.shape[0], b.shape[1]
    if out is None:
        out = nan_out(M, N)
    y = gemm(a, b, bias, precision=precision, activation=activation, out=out)
    assert y is out
    assert not torch.isnan(y).any(), "some outputs were not written"
    ref = reference(a, b, bias, activation)
    err = relative_error(y, ref)
    err_torch = relative_error(torch_in_precision(a, b, bias, activation, precision), ref)
    bound = (factor or FACTOR[precision]) * err_torch + ATOL[precision]
    assert err <= bound, f"{precision}: error {err:.3e} > {bound:.3e} (torch's own error {err_torch:.3e})"
    return err


# --------------------------------------------------------------------------------------- shapes, modes


@pytest.mark.parametrize(
    ("M", "K", "N"),
    [
        (97, 37, 70),  # ragged in every dimension: 2 x 2 tiles, 2 K blocks, the last one partial
        (1, 16, 16),
        (130, 5, 3),  # K and N far below one block
        (64, 100, 8),  # a narrow head
        (40, 64, 129),  # 3 column blocks, the last one a single column
    ],
)
def test_odd_shapes_price_levels_fp32(M: int, K: int, N: int) -> None:
    a = price_levels(M, K, seed=M)
    b = zero_sum_b(K, N)
    check(a, b, torch.randn(N, generator=_gen(3)).to(DEVICE))


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("bdtype", [torch.float16, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("data", ["prices", "returns"])
def test_precisions(precision: str, bdtype: torch.dtype, data: str) -> None:
    M, K, N = 70, 48, 40
    a = price_levels(M, K) if data == "prices" else returns(M, K)
    b = zero_sum_b(K, N, dtype=bdtype)
    err = check(a, b, precision=precision)
    if precision == "fp32" and data == "prices":
        assert err < 1e-5


def test_fp32_mode_keeps_the_low_parts() -> None:
    """On price levels "fp32" must be orders of magnitude better than "tf32" (the split is not dropped).

    Under the interpreter through the tensor-core model (its plain tl.dot is exact float32, where feeding
    a whole would pass), on a GPU through the tensor cores themselves."""
    a = price_levels(64, 64, seed=5)
    b = zero_sum_b(64, 32, dtype=torch.float32)
    ref = reference(a, b)
    with emulate_tensor_cores() if torch_side.INTERPRETED else contextlib.nullcontext() as emu:
        e32 = relative_error(gemm(a, b, precision="fp32"), ref)
        etf = relative_error(gemm(a, b, precision="tf32"), ref)
    assert emu is None or emu.calls > 0
    assert e32 * 100 < etf, (e32, etf)


# ------------------------------------------------------------------------------- strides and layouts


def _a_layouts(M: int, K: int) -> dict[str, torch.Tensor]:
    buf = price_levels(2 * M, K + 7, seed=11)
    return {
        "contiguous": buf[:M, :K].contiguous(),
        "row_slice": buf[:M, 3 : 3 + K],  # row stride K + 7
        "transposed": buf[:M, :K].T.contiguous().T,  # M contiguous
        "every_other_row": buf[::2, 1 : 1 + K],
    }


@pytest.mark.parametrize("a_layout", ["contiguous", "row_slice", "transposed", "every_other_row"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_strides(a_layout: str, precision: str) -> None:
    M, K, N = 45, 33, 20
    a = _a_layouts(M, K)[a_layout]
    assert a.shape == (M, K)
    if precision == "fp16":
        a = a - 100.0  # fp16 is for normalised data
    check(a, zero_sum_b(K, N), precision=precision)


@pytest.mark.parametrize("b_layout", ["transposed", "column_slice"])
def test_b_strides(b_layout: str) -> None:
    K, N = 40, 24
    if b_layout == "transposed":
        b = zero_sum_b(N, K).T  # a torch.nn.Linear weight passed as w.T
    else:
        b = zero_sum_b(K, N + 5)[:, 2 : 2 + N]
    for precision in ("fp32", "fp16"):
        check(returns(50, K), b, precision=precision)


@pytest.mark.parametrize("out_layout", ["transposed", "column_slice", "strided"])
def test_out_strides_write_only_the_view(out_layout: str) -> None:
    M, K, N = 37, 20, 18
    a = returns(M, K, seed=2)
    b = zero_sum_b(K, N)
    if out_layout == "transposed":
        big = torch.full((N, M), math.nan, device=DEVICE)
        out = big.T
    elif out_layout == "column_slice":
        big = torch.full((M, N + 3), math.nan, device=DEVICE)
        out = big[:, 1 : 1 + N]
    else:
        big = torch.full((2 * M, 2 * N), math.nan, device=DEVICE)
        out = big[::2, ::2]
    check(a, b, out=out)
    outside = torch.ones_like(big, dtype=torch.bool)
    if out_layout == "transposed":
        outside[:] = False
    elif out_layout == "column_slice":
        outside[:, 1 : 1 + N] = False
    else:
        outside[::2, ::2] = False
    assert torch.isnan(big[outside]).all(), "the kernel wrote outside the out view"


@pytest.mark.parametrize("adtype", [torch.float16, torch.bfloat16])
def test_half_inputs_and_bias(adtype: torch.dtype) -> None:
    a = returns(50, 32, seed=9).to(adtype)
    bias = torch.randn(20, generator=_gen(2)).half().to(DEVICE)
    check(a, zero_sum_b(32, 20), bias)
    check(a, zero_sum_b(32, 20, dtype=torch.float32), bias)


def test_out_none_is_contiguous() -> None:
    a, b = returns(33, 16), zero_sum_b(16, 20)
    y = gemm(a, b)
    assert y.shape == (33, 20) and y.is_contiguous() and y.dtype == torch.float32
    assert relative_error(y, reference(a, b)) < 1e-6


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_packed_weights_match_plain_calls(precision: str) -> None:
    a = returns(40, 24, seed=4)
    for dtype in (torch.float16, torch.float32):
        b = zero_sum_b(24, 17, dtype=dtype)
        packed = pack_weights(b, precision)
        assert isinstance(packed, PackedWeights) and packed.shape == (24, 17)
        torch.testing.assert_close(gemm(a, packed, precision=precision), gemm(a, b, precision=precision))
    with pytest.raises(ShapeError, match="packed for precision"):
        gemm(a, pack_weights(b, "tf32" if precision != "tf32" else "fp32"), precision=precision)


def test_plain_weights_are_packed_once_and_repacked_after_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A steady-state call with the same weights does no packing; an in-place write to them (or through a
    view) is seen through the version counter; a view made afresh per call (``w.T``) still hits."""
    gemm_mod.clear_weight_cache()
    calls: list[int] = []
    real_pack = gemm_mod._pack
    monkeypatch.setattr(gemm_mod, "_pack", lambda b, p: calls.append(1) or real_pack(b, p))
    a = returns(40, 24, seed=4)
    w = zero_sum_b(17, 24, dtype=torch.float32)  # [N, K], used as w.T
    y0 = gemm(a, w.T, precision="tf32")
    gemm(a, w.T, precision="tf32")
    assert len(calls) == 1
    w.T[3, 5] += 1.0  # through a view: shares the version counter
    y1 = gemm(a, w.T, precision="tf32")
    assert len(calls) == 2
    torch.testing.assert_close(y1, torch_in_precision(a, w.T, precision="tf32"), rtol=1e-3, atol=1e-3)
    assert not torch.equal(y0, y1)
    gemm(a, w.T, precision="fp32")  # another precision: its own entry
    assert len(calls) == 3
    del w
    assert all(
        ref() is not None for ref, _, _ in gemm_mod._PACK_CACHE.entries.values()
    )  # freed weights drop out
    gemm_mod.clear_weight_cache()


# ------------------------------------------------------------------------------------------ epilogue


@pytest.mark.parametrize("activation", [None, "none", "relu", "gelu", "tanh"])
def test_activations(activation: str | None) -> None:
    a = 0.5 * returns(60, 16, seed=12)
    b = zero_sum_b(16, 32)
    bias = torch.linspace(-1.0, 1.0, 32).to(DEVICE)
    check(a, b, bias, activation=activation)


def test_nan_in_a_reaches_only_its_row() -> None:
    a = returns(70, 40, seed=13)
    a[17, 5] = math.nan
    y = gemm(a, zero_sum_b(40, 24))
    rows = torch.isnan(y).any(dim=1)
    expected = torch.zeros(70, dtype=torch.bool, device=DEVICE)
    expected[17] = True
    assert torch.equal(rows, expected) and torch.isnan(y[17]).all()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf in a where()
@pytest.mark.parametrize("bdtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_infinite_input_is_not_turned_into_nan(precision: str, bdtype: torch.dtype) -> None:
    """float32 b adds a TF32 low part in "fp32" (0 for 0.5): inf times it must not make NaN."""
    a = torch.zeros(16, 16, device=DEVICE)
    a[3, 2] = math.inf
    b = torch.full((16, 16), 0.5, dtype=bdtype, device=DEVICE)
    y = gemm(a, b, precision=precision)
    ref = reference(a, b)
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.equal(torch.isinf(y), torch.isinf(ref))


# ------------------------------------------------------------------- tensor-core numerics (emulated)


@pytest.mark.parametrize(("block", "extra_bits"), [(4, 0), (8, 3)])
@pytest.mark.parametrize("bdtype", [torch.float16, torch.float32])
def test_fp32_split_is_accurate_on_emulated_tensor_cores(block: int, extra_bits: int, bdtype) -> None:
    """With TF32 truncation and round-toward-zero accumulation modelled, "fp32" stays within 4x torch fp32."""
    a = price_levels(64, 96, seed=31)
    b = zero_sum_b(96, 32, dtype=bdtype)
    with emulate_tensor_cores(block=block, extra_bits=extra_bits) as emu:
        check(a, b)
    assert emu.calls > 0


@pytest.mark.parametrize("bdtype", [torch.float16, torch.float32])
def test_identity_b_reproduces_a_exactly_on_emulated_tensor_cores(
    monkeypatch: pytest.MonkeyPatch, bdtype: torch.dtype
) -> None:
    """a @ I == a bit for bit with the three-way split; the two-way split's 13-bit remainder is truncated.

    Every float32 value is hi + mid + lo with TF32-exact parts, so the products are exact and their sum is
    a again. The old two-way split (hi + a 13-bit remainder) loses up to 2 bits of the remainder in the
    tensor core, about 2**-22 of |a| (4x float32 rounding) on every term: what the H200 measurements showed.
    """
    a = price_levels(64, 16, seed=32)
    eye = torch.eye(16, dtype=bdtype, device=DEVICE)
    with emulate_tensor_cores():
        assert torch.equal(gemm(a, eye), a)
        monkeypatch.setattr(gemm_mod, "_A_SPLIT", 2)
        two_way = gemm(a, eye)
    rel = ((two_way - a).abs() / a.abs()).max().item()
    assert 2**-24 < rel <= 2**-21, rel


def test_flush_keeps_long_sums_accurate_on_emulated_tensor_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """K = 2048 on price levels: the tensor core's round-toward-zero accumulation, left to act on the running
    sum, biases the error (linear in K); adding each block's products on the CUDA cores (the flush) keeps
    "fp32" within 4x torch's float32 error."""
    a = price_levels(32, 2048, seed=33)
    b = zero_sum_b(2048, 16)
    ref = reference(a, b)
    with emulate_tensor_cores():
        check(a, b)
        e_on = relative_error(gemm(a, b), ref)
        monkeypatch.setattr(gemm_mod, "_FLUSH", False)
        e_off = relative_error(gemm(a, b), ref)
    assert e_off > 5 * e_on, (e_off, e_on)


_needs_interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the tensor-core model replaces tl.dot in the Triton interpreter"
)


@_needs_interpreter
def test_tf32_rounds_a_instead_of_truncating_on_emulated_tensor_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Precision "tf32" on normalised returns, K = 1024, both ways of rounding a (in registers: one column
    block; the pre-pass: two): about half the error of letting the tensor core truncate a (2x the RMS), and
    at the TF32 yardstick (both operands rounded, float32 accumulation)."""
    a, b = returns(32, 1024, seed=34), zero_sum_b(1024, 48)
    ref = reference(a, b)
    yardstick = relative_error(torch_in_precision(a, b, precision="tf32"), ref)
    for block_n in (64, 32):  # one column block (ROUND_A in the kernel), two (the pre-pass)
        spec = gemm_mod._validate(a, b, None, None, None, "tf32")
        cfg = autotune.Config("c", {"BLOCK_M": 32, "BLOCK_N": block_n, "BLOCK_K": 32, "GROUP_M": 8}, 4, 1)
        errs = []
        for rounding in (True, False):
            monkeypatch.setattr(gemm_mod, "_ROUND_A_TF32", rounding)
            out = nan_out(32, 48)
            with emulate_tensor_cores():
                gemm_mod._gemm_triton(a, b, None, out, spec, config=cfg)
            errs.append(relative_error(out, ref))
        assert errs[0] <= 1.1 * yardstick and errs[1] > 1.5 * errs[0], (block_n, errs, yardstick)


@pytest.mark.parametrize("layout", ["row", "col"])
def test_tf32_in_kernel_rounding_equals_the_pre_pass(monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """Rounding a in the kernel's registers and rounding it in a pre-pass give the same product, bit for bit
    (same config, only the place of the rounding differs); each path runs where it was chosen."""
    a = returns(40, 96, seed=35) if layout == "row" else returns(96, 40, seed=35).T
    b = zero_sum_b(96, 24)
    spec = gemm_mod._validate(a, b, None, None, None, "tf32")
    cfg = autotune.Config("c", {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, 4, 1)
    calls: list[int] = []
    prepass = gemm_mod.round_tf32_into

    def counted(src: torch.Tensor, dst: torch.Tensor) -> None:
        calls.append(1)
        prepass(src, dst)

    monkeypatch.setattr(gemm_mod, "round_tf32_into", counted)
    outs = []
    for in_kernel in (True, False):
        monkeypatch.setattr(gemm_mod, "_round_a_in_kernel", lambda n_cols, kw, v=in_kernel: v)
        out = nan_out(40, 24)
        gemm_mod._gemm_triton(a, b, None, out, spec, config=cfg)
        outs.append(out)
    assert calls == [1], "the pre-pass ran in the wrong case"
    assert torch.equal(outs[0], outs[1])
    ref = round_to_tf32_rne(a).double() @ round_to_tf32(b).double()
    assert relative_error(outs[0], ref) < 1e-5


def test_tf32_rounding_place_follows_the_traffic() -> None:
    """In the kernel only with one column block and <= 64 a values per thread; the pre-pass otherwise."""
    kw = {"BLOCK_M": 128, "BLOCK_K": 64, "num_warps": 4}
    assert gemm_mod._round_a_in_kernel(1, kw)
    assert not gemm_mod._round_a_in_kernel(2, kw)  # a loaded once per column block: round it once
    assert not gemm_mod._round_a_in_kernel(1, {**kw, "BLOCK_K": 128})  # spills on sm_90
    assert gemm_mod._round_a_in_kernel(1, {**kw, "BLOCK_M": 256, "num_warps": 8})


# ------------------------------------------------------------------------------------ internal variants


def test_small_blocks_cover_every_boundary() -> None:
    """Fixed 16-wide blocks and grouped ordering: many ragged tiles and K steps."""
    a, b = price_levels(45, 37, seed=14), zero_sum_b(37, 35)
    spec = gemm_mod._validate(a, b, None, None, None, "fp32")
    out = nan_out(45, 35)
    cfg = autotune.Config("small", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}, 4, 1)
    gemm_mod._gemm_triton(a, b, None, out, spec, config=cfg)
    assert not torch.isnan(out).any()
    err_torch = relative_error(torch_in_precision(a, b), reference(a, b))
    assert relative_error(out, reference(a, b)) <= FACTOR["fp32"] * err_torch + ATOL["fp32"]


def test_a16_candidate_casts_a_first() -> None:
    """The "fp16" candidates that cast a in a pass before the kernel compute the same product."""
    a, b = returns(40, 32, seed=15), zero_sum_b(32, 24)
    spec = gemm_mod._validate(a, b, None, None, None, "fp16")
    outs = []
    for a16 in (0, 1):
        out = nan_out(40, 24)
        meta = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "A16": a16}
        gemm_mod._gemm_triton(a, b, None, out, spec, config=autotune.Config("c", meta, 4, 1))
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    assert relative_error(outs[0], reference(a, b)) < 2e-3


@pytest.mark.skipif(torch.cuda.is_available(), reason="the torch path serves CPU tensors only")
def test_torch_path_without_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_side, "INTERPRETED", False)

    def no_triton(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Triton path ran")

    monkeypatch.setattr(gemm_mod, "_gemm_triton", no_triton)
    a, b = price_levels(300, 64), zero_sum_b(64, 24)
    bias = torch.randn(24, generator=_gen(1))
    for act in (None, "gelu", "tanh"):
        check(a, b, bias, activation=act)
        check(a, pack_weights(b).source, bias, activation=act, out=nan_out(300, 24, transposed=True))


def test_empty_and_k0() -> None:
    assert gemm(torch.zeros(0, 8, device=DEVICE), torch.zeros(8, 4, device=DEVICE)).shape == (0, 4)
    bias = torch.arange(3.0, device=DEVICE)
    y = gemm(torch.zeros(5, 0, device=DEVICE), torch.zeros(0, 3, device=DEVICE), bias, activation="relu")
    assert torch.equal(y, bias.expand(5, 3))


# ------------------------------------------------------------------------------------------ validation


def _bad_calls() -> list[tuple[str, dict]]:
    a = torch.zeros(10, 8)
    b = torch.zeros(8, 6, dtype=torch.float16)
    ok = {"a": a, "b": b}
    return [
        ("a 3-D", {**ok, "a": torch.zeros(2, 10, 8)}),
        ("b 1-D", {**ok, "b": torch.zeros(8)}),
        ("a int", {**ok, "a": torch.zeros(10, 8, dtype=torch.int32)}),
        ("a float64", {**ok, "a": torch.zeros(10, 8, dtype=torch.float64)}),
        ("b int", {**ok, "b": torch.zeros(8, 6, dtype=torch.int8)}),
        ("a not a tensor", {**ok, "a": [[1.0]]}),
        ("b not a tensor", {**ok, "b": [[1.0]]}),
        ("K mismatch", {**ok, "b": torch.zeros(6, 8)}),
        ("bad activation", {**ok, "activation": "sigmoid"}),
        ("unhashable activation", {**ok, "activation": ["relu"]}),
        ("bad precision", {**ok, "precision": "fp64"}),
        ("bias shape", {**ok, "bias": torch.zeros(5)}),
        ("bias 2-D", {**ok, "bias": torch.zeros(6, 1)}),
        ("bias int", {**ok, "bias": torch.zeros(6, dtype=torch.int64)}),
        ("out shape", {**ok, "out": torch.zeros(6, 10)}),
        ("out dtype", {**ok, "out": torch.zeros(10, 6, dtype=torch.float16)}),
        ("out overlapping", {**ok, "out": torch.zeros(1, 6).expand(10, 6)}),
        ("out aliases a", {"a": torch.zeros(10, 6), "b": torch.zeros(6, 6)}),
        ("meta device a", {**ok, "a": torch.zeros(10, 8, device="meta")}),
        ("meta device b", {**ok, "b": torch.zeros(8, 6, device="meta")}),
    ]


@pytest.mark.parametrize(("name", "kwargs"), _bad_calls(), ids=[n for n, _ in _bad_calls()])
def test_validation_errors(name: str, kwargs: dict) -> None:
    if name == "out aliases a":
        kwargs = {**kwargs, "out": kwargs["a"]}
    with pytest.raises(ShapeError) as info:
        gemm(**kwargs)
    assert info.value.hint, "every ShapeError carries a hint"


def test_validation_mentions_expected_and_actual() -> None:
    with pytest.raises(ShapeError, match=r"K = 8 .*\(6, 8\)"):
        gemm(torch.zeros(10, 8), torch.zeros(6, 8))


@pytest.mark.gpu
def test_device_mismatch_gpu() -> None:
    with pytest.raises(ShapeError, match="b is on"):
        gemm(torch.zeros(4, 8, device="cuda"), torch.zeros(8, 3))
    with pytest.raises(ShapeError, match="out is on"):
        gemm(torch.zeros(4, 8, device="cuda"), torch.zeros(8, 3, device="cuda"), out=torch.zeros(4, 3))


# ------------------------------------------------------------------------------------------- autotune


def test_interpreter_uses_fixed_config() -> None:
    space = gemm_space("fp32", 97, 70, 37)
    assert autotune.select(space, "k", lambda cfg: 1 / 0, device=torch.device("cpu")) is space.interpreter


_SMEM_LIMIT = 232448  # bytes of shared memory per block on sm_90 (H100 / H200)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize("tma", [False, True])
def test_config_spaces_are_valid(precision: str, tma: bool) -> None:
    for M, N, K in ((65536, 64, 256), (65536, 256, 8192), (4096, 4096, 4096), (100003, 24, 384), (7, 8, 5)):
        space = gemm_space(precision, M, N, K, tma=tma)
        names = [c.name for c in space.configs]
        assert len(names) == len(set(names)) and space.default in space.configs
        assert not space.default.meta.get("TMA")  # the untuned default runs on any GPU
        n_tma = sum(1 for c in space.configs if c.meta.get("TMA"))
        assert (n_tma > 0) == (tma and precision != "fp32" and N > 64), (M, N, K, n_tma)
        assert 3 <= len(names) - n_tma <= 8 or min(M, N, K) < 16
        for c in space.configs:
            m = c.meta
            assert min(m["BLOCK_M"], m["BLOCK_N"], m["BLOCK_K"]) >= 16
            assert m["BLOCK_N"] <= max(16, autotune.pow2_bucket(N))
            a_bytes = 2 if m.get("A16") else 4
            b_bytes = 2 if precision == "fp16" else 4
            stage = m["BLOCK_M"] * m["BLOCK_K"] * a_bytes + m["BLOCK_K"] * m["BLOCK_N"] * b_bytes
            assert stage * c.num_stages <= _SMEM_LIMIT, c.name


# ---------------------------------------------------------------------------------------------- TMA


@pytest.mark.parametrize(("precision", "a16"), [("tf32", 0), ("fp16", 0), ("fp16", 1)])
@pytest.mark.parametrize(("M", "K", "N"), [(70, 52, 96), (33, 36, 200)])
def test_tma_kernel_matches_the_reference(precision: str, a16: int, M: int, K: int, N: int) -> None:
    """The TMA kernel (descriptors emulated by the interpreter) over edge tiles in every dimension, with bias,
    activation and a transposed output; the fp16 A16 variant reads a padded float16 copy of a."""
    a = returns(M, K, seed=40)
    b = zero_sum_b(K, N, dtype=torch.float32 if precision == "tf32" else torch.float16)
    bias = torch.randn(N, generator=_gen(41)).to(DEVICE)
    spec = gemm_mod._validate(a, b, bias, None, "gelu", precision)
    assert gemm_mod._tma_ok(a, gemm_mod._pack_cached(b, precision), spec)
    out = nan_out(M, N, transposed=True)
    gemm_mod._gemm_triton(a, b, bias, out, spec, config=gemm_mod._cfg(32, 64, 16, 4, 1, a16=a16, tma=1))
    ref = reference(a, b, bias, "gelu")
    assert not torch.isnan(out).any()
    err_torch = relative_error(torch_in_precision(a, b, bias, "gelu", precision), ref)
    assert relative_error(out, ref) <= 2 * err_torch + ATOL[precision]


def test_tma_tf32_needs_rounding_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where descriptors cannot round to TF32, "tf32" keeps the pointer kernels (truncation doubles the error)."""
    from tsconv.kernels import tma
    from tsconv.kernels.conv1d import dense
    from tsconv.kernels.conv1d import spec as conv_spec

    monkeypatch.setattr(tma, "rounds_tf32", lambda: False)
    a, b = returns(100, 64), zero_sum_b(64, 128, dtype=torch.float32)
    for prec, want in (("tf32", False), ("fp16", True)):
        spec = gemm_mod._validate(a, b, None, None, None, prec)
        assert gemm_mod._tma_ok(a, gemm_mod._pack_cached(b, prec), spec) is want
        x = torch.randn(1, 40, 16, generator=_gen(3)).to(DEVICE).transpose(1, 2)  # time-major
        cspec = conv_spec.validate(
            x,
            zero_sum_b(16, 16).T.unsqueeze(-1),
            None,
            None,
            dilation=1,
            groups=1,
            padding="causal",
            activation=None,
            precision=prec,
        )
        assert dense._dense_tma_ok(x, cspec) is want


def test_tma_needs_fitting_operands() -> None:
    """Descriptors need a contiguous last dim and 16-byte aligned rows and base; "fp32" never uses them."""
    from tsconv.kernels import tma

    ok = returns(100, 64)
    for a, prec, want in (
        (ok, "tf32", True),
        (ok, "fp16", True),
        (ok, "fp32", False),
        (ok.half(), "tf32", False),  # float16 a in "tf32": exact already, the plain kernel
        (ok.T.contiguous().T, "tf32", False),  # column-major
        (returns(100, 65)[:, 1:], "tf32", False),  # misaligned base and rows
        (returns(100, 66)[:, :63], "tf32", False),  # 264-byte rows
    ):
        b = zero_sum_b(a.shape[1], 128, dtype=torch.float32)
        spec = gemm_mod._validate(a, b, None, None, None, prec)
        assert gemm_mod._tma_ok(a, gemm_mod._pack_cached(b, prec), spec) is want, (prec, a.stride())
    desc = tma.descriptor(ok, [32, 16], round_tf32=True)
    assert desc.round_f32_to_tf32 and list(desc.block_shape) == [32, 16]
    assert not getattr(tma.descriptor(ok, [32, 16]), "round_f32_to_tf32", False)


# ------------------------------------------------------------------------------------------ launch plans


@pytest.fixture
def plans():
    """The gemm launch-plan cache, emptied before and after the test."""
    gemm_mod._PLANS.clear()
    yield gemm_mod._PLANS
    gemm_mod._PLANS.clear()


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_repeated_call_replays_its_plan_with_the_new_tensors(plans, precision: str) -> None:
    """The second call with the same layouts takes the plan and computes the product of its own operands,
    bias and output (a plan keeps no tensor of the call that recorded it)."""
    b, bias = zero_sum_b(48, 20, dtype=torch.float32), torch.randn(20, generator=_gen(9)).to(DEVICE)
    y1 = gemm(returns(50, 48, seed=1), b, bias, activation="tanh", precision=precision)
    assert (plans.hits, plans.misses, len(plans)) == (0, 1, 1)
    a2, b2, bias2 = returns(50, 48, seed=2), zero_sum_b(48, 20, seed=3, dtype=torch.float32), bias + 1.0
    out = nan_out(50, 20, transposed=True)
    gemm(a2, b2, bias2, activation="tanh", precision=precision, out=out)  # out's layout: a new key
    y2 = gemm(a2, b2, bias2, activation="tanh", precision=precision, out=nan_out(50, 20, transposed=True))
    assert (plans.hits, len(plans)) == (1, 2)
    torch.testing.assert_close(y2, out, rtol=0, atol=0)
    ref = reference(a2, b2, bias2, "tanh")
    err_torch = relative_error(torch_in_precision(a2, b2, bias2, "tanh", precision), ref)
    assert relative_error(y2, ref) <= FACTOR[precision] * err_torch + ATOL[precision]
    assert not torch.equal(y1, gemm(a2, b2, bias2, activation="tanh", precision=precision))
    assert plans.hits == 2


@pytest.mark.parametrize(
    ("precision", "a16", "tma", "prep"),
    [("tf32", 0, 0, "round"), ("tf32", 0, 1, "none"), ("fp16", 1, 0, "a16"), ("fp16", 1, 1, "a16"),
     ("fp16", 0, 1, "none")],
)  # fmt: skip
def test_plans_replay_copies_of_a_and_tma_launches(
    plans, precision: str, a16: int, tma: int, prep: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plans also cover the launches that read a copy of ``a`` (the fp16 cast, the tf32 rounding pre-pass)
    and the TMA kernel (descriptors built from the call's tensors), with the new operands' product."""
    cfg = gemm_mod._cfg(32, 64, 16, 4, 1, a16=a16, tma=tma)
    monkeypatch.setattr(gemm_mod.autotune, "select", lambda *a, **kw: cfg)
    b_dtype = torch.float32 if precision == "tf32" else torch.float16
    gemm(returns(70, 52, seed=1), zero_sum_b(52, 96, dtype=b_dtype), precision=precision)
    entry = next(iter(plans._plans.values()))
    assert entry.config == cfg.name and (entry.tma is not None) == (tma > 0)
    want = {"none": gemm_mod._PREP_NONE, "a16": gemm_mod._PREP_A16, "round": gemm_mod._PREP_ROUND}[prep]
    assert entry.prep == want
    a, b = returns(70, 52, seed=2), zero_sum_b(52, 96, seed=3, dtype=b_dtype)
    bias = torch.randn(96, generator=_gen(4)).to(DEVICE)
    gemm(a, b, bias, activation="gelu", precision=precision, out=nan_out(70, 96, transposed=True))
    y = gemm(a, b, bias, activation="gelu", precision=precision, out=nan_out(70, 96, transposed=True))
    assert plans.hits == 1
    ref = reference(a, b, bias, "gelu")
    err_torch = relative_error(torch_in_precision(a, b, bias, "gelu", precision), ref)
    assert not torch.isnan(y).any()
    assert relative_error(y, ref) <= FACTOR[precision] * err_torch + ATOL[precision]


def test_plans_follow_layout_alignment_and_weight_writes(plans) -> None:
    """Another stride, a 16-byte-misaligned view of a (Triton specializes on alignment) or another
    activation record new plans; an in-place write to plain weights is seen on a plan hit."""
    base = returns(41, 33, seed=6)
    b = zero_sum_b(32, 16, dtype=torch.float32)
    gemm(base[:40, :32], b)
    gemm(base[:40, :32], b)
    gemm(base[1:, 1:], b)  # starts 4 bytes in: not 16-byte aligned
    gemm(base[:40, :32].T.contiguous().T, b)
    gemm(base[:40, :32], b, activation="relu")
    assert (plans.hits, len(plans)) == (1, 4)
    b[3, 4] += 2.0
    y = gemm(base[1:, 1:], b)
    assert plans.hits == 2
    assert relative_error(y, reference(base[1:, 1:], b)) < 1e-6


def test_plan_hit_still_refuses_an_output_overlapping_the_inputs(plans) -> None:
    buf = torch.zeros(2, 64, 32, device=DEVICE)
    b = zero_sum_b(16, 16)
    gemm(buf[0, :, :16], b, out=buf[1, :, 16:])
    gemm(buf[0, :, :16], b, out=buf[1, :, 16:])
    assert plans.hits == 1
    with pytest.raises(ShapeError, match="overlaps a"):
        gemm(buf[1, :, :16], b, out=buf[1, :, 16:])  # the plan's layouts and alignments, shared memory
    flat = torch.zeros(64 * 16 + 16, device=DEVICE)
    out_view = flat[: 64 * 16].view(64, 16)
    gemm(buf[0, :, :16], b, flat[64 * 16 :], out=out_view)
    gemm(buf[0, :, :16], b, flat[64 * 16 :], out=out_view)
    assert plans.hits == 3  # the refused call above found its plan too
    with pytest.raises(ShapeError, match="overlaps bias"):
        gemm(buf[0, :, :16], b, flat[64 * 16 - 16 : 64 * 16], out=out_view)
    with pytest.raises(ShapeError, match="activation must be"):
        gemm(buf[0, :, :16], b, activation=["relu"])  # unhashable: no plan lookup, the validation's error


def test_plans_are_dropped_with_the_tuner_memory_and_can_be_switched_off(
    plans, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = returns(20, 16), zero_sum_b(16, 8)
    gemm(a, b)
    assert len(plans) == 1
    autotune.clear_memory_cache()
    assert len(plans) == 0
    monkeypatch.setattr(gemm_mod, "_PLANS_ENABLED", False)
    y = gemm(a, b)
    assert len(plans) == 0 and plans.misses == 0
    assert relative_error(y, reference(a, b)) < 1e-6


def test_launch_plan_needs_every_kernel_parameter() -> None:
    from tsconv.kernels.launch import LaunchPlan

    with pytest.raises(TypeError, match="no value for kernel parameter 'blo_ptr'"):
        LaunchPlan(gemm_mod._gemm_kernel, None, (1,), {"a_ptr": None, "b_ptr": None}, ("a_ptr",))


# ------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
@pytest.mark.parametrize(("M", "K", "N"), [(65536, 256, 64), (4096, 1024, 1000), (20001, 384, 24)])
def test_gpu_real_sizes(
    precision: str, M: int, K: int, N: int, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TSCONV_AUTOTUNE", "1")
    autotune.clear_memory_cache()
    a = price_levels(M, K) if precision == "fp32" else returns(M, K)
    b = zero_sum_b(K, N)
    check(a, b, torch.randn(N, generator=_gen(5)).to(DEVICE), precision=precision, activation="gelu")
    assert list(tmp_path.glob("autotune-*.json")), "the tuner did not write its cache"


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("precision", "cfg"),
    [("fp32", None), ("tf32", None), ("fp16", None), ("tf32", (128, 64, 32, 4, 3, 8, 0, 1)),
     ("fp16", (128, 64, 64, 4, 3, 8, 1, 1)), ("fp16", (128, 64, 64, 4, 3, 8, 1, 0))],
)  # fmt: skip
def test_gpu_plan_replay_is_a_direct_launch_with_the_same_result(
    plans, precision: str, cfg: tuple | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the replay calls the compiled kernel itself (TMA descriptors and the fp16 cast included), and
    gives the full path's result bit for bit."""
    if cfg is not None:
        monkeypatch.setattr(gemm_mod.autotune, "select", lambda *a, **kw: gemm_mod._cfg(*cfg))
    a = price_levels(65536, 256) if precision == "fp32" else returns(65536, 256)
    b = zero_sum_b(256, 64)
    bias = torch.randn(64, generator=_gen(5)).to(DEVICE)
    full = gemm(a, b, bias, activation="gelu", precision=precision)
    entry = next(iter(plans._plans.values()))
    assert entry.plan.compiled
    if cfg is not None:
        assert entry.config == gemm_mod._cfg(*cfg).name
    replay = gemm(a, b, bias, activation="gelu", precision=precision, out=nan_out(65536, 64))
    replay = gemm(a, b, bias, activation="gelu", precision=precision, out=nan_out(65536, 64))
    assert plans.hits == 1
    torch.testing.assert_close(replay, full, rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_transposed_operands() -> None:
    a = price_levels(3000, 512).T.contiguous().T
    check(a, zero_sum_b(512, 96), out=nan_out(3000, 96, transposed=True))
    check(a - 100.0, zero_sum_b(96, 512).T, precision="fp16")


# ---------------------------------------------------------------------------------- sm_90 compilation


_COMPILE_SCRIPT = r"""
from tsconv.kernels import gemm as g

fn = g._gemm_kernel


def build_gemm(prec, cfg, a16, round_a=False):
    fp32_b = prec != 2
    runtime = [
        ("a_ptr", "*fp16" if a16 else "*fp32", "D"), ("b_ptr", "*fp32" if fp32_b else "*fp16", "D"),
        ("blo_ptr", "*fp32" if fp32_b else "*fp16", "D"), ("bias_ptr", "*fp32", "D"), ("c_ptr", "*fp32", "D"),
        ("M", "i32", ""), ("N", "i32", "D"), ("K", "i32", "D"), ("stride_am", "i32", "D"),
        ("stride_ak", "i32", "1"), ("stride_bk", "i32", "1" if fp32_b else "D"),
        ("stride_bn", "i32", "D" if fp32_b else "1"), ("stride_cm", "i32", "D"), ("stride_cn", "i32", "1"),
    ]
    consts = dict(HAS_BIAS=True, ACT=2, PREC=prec, A_SPLIT=3 if prec == 0 else 1, W_SPLIT=prec == 0,
                  FLUSH=True, ROUND_A=round_a)
    return build(fn, runtime, consts, cfg)


def spilled_bytes(ck):
    return ptxas_usage(ck)[1]


def a_from_registers(ck):
    # wgmma with A in registers lists them in braces after the accumulator list; from shared memory, a
    # descriptor
    wg = [ln for ln in ck.asm["ptx"].splitlines() if "wgmma.mma_async" in ln]
    assert wg
    return [ln.split("}", 1)[1].lstrip(", ").startswith("{") for ln in wg]


for pname, prec in (("fp32", 0), ("tf32", 1), ("fp16", 2)):
    for M, N, K in ((65536, 64, 256), (4096, 4096, 4096)):
        cfg = g.gemm_space(pname, M, N, K).default
        ck = build_gemm(prec, cfg, bool(cfg.meta.get("A16")))
        assert "warp_group_dot" in ck.asm["ttgir"], (pname, cfg.name, "no Hopper tensor cores (wgmma)")
        assert ck.metadata.shared <= 232448, (pname, cfg.name, ck.metadata.shared)
        if pname == "tf32":  # a as loaded (pre-rounded copy): both operands straight from shared memory
            assert not any(a_from_registers(ck)), cfg.name
# "tf32" narrow heads: the configs that round a in registers (ROUND_A) compile without spills
n_in_kernel = 0
for cfg in g.gemm_space("tf32", 65536, 64, 256).configs:
    kw = cfg.launch_kwargs()
    if not g._round_a_in_kernel(triton.cdiv(64, kw["BLOCK_N"]), kw):
        continue
    n_in_kernel += 1
    ck = build_gemm(1, cfg, False, round_a=True)
    assert all(a_from_registers(ck)), cfg.name
    assert spilled_bytes(ck) == 0, (cfg.name, "spills with a rounded in registers")
assert n_in_kernel >= 4, n_in_kernel
print("compiled OK")
"""


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU machine the real kernels run in the other tests"
)
@pytest.mark.slow
def test_kernel_compiles_for_sm90() -> None:
    """Compile (not run) each precision's default narrow and wide configs for an H100/H200 with the installed
    Triton's ptxas: catches what the interpreter does not check, and pins wgmma and the shared-memory budget."""
    run_compile_script(_COMPILE_SCRIPT)


# --------------------------------------------------------------------------------------------------------
# the custom op: torch.compile traces through gemm
# --------------------------------------------------------------------------------------------------------


def test_gemm_op_passes_opcheck_and_compiles_into_one_graph():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(9, 6, generator=g).to(DEVICE)
    b = torch.randn(6, 5, generator=g).to(DEVICE)
    bias = torch.randn(5, generator=g).to(DEVICE)
    torch.library.opcheck(torch.ops.tsconv.gemm.default, (a, b, bias, "gelu", "fp32"))
    packed = pack_weights(b, "fp32")

    def f(a: torch.Tensor) -> torch.Tensor:
        return gemm(a, packed, bias, activation="relu") + gemm(a, b, out=torch.empty(9, 5, device=a.device))

    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, backend="aot_eager", fullgraph=True)(a), f(a))


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_weights_written_by_out_are_not_served_stale_from_the_cache(precision: str) -> None:
    # a Triton launch writes ``out`` without bumping its version counter: weights a gemm wrote into a buffer
    # were served the packed copy cached from the buffer's earlier values (the second product equal to the
    # first, 4.4 off the new one), where torch's own out= ops bump the counter
    g = _gen(12)
    a = torch.randn(8, 4, generator=g).to(DEVICE)
    src1, src2 = (torch.randn(4, 5, generator=g).to(DEVICE) for _ in range(2))
    proj, w = torch.randn(5, 3, generator=g).to(DEVICE), torch.empty(4, 3, device=DEVICE)
    gemm(src1, proj, out=w)
    first = gemm(a, w, precision=precision)
    gemm(src2, proj, out=w)
    second = gemm(a, w, precision=precision)
    want = (a.double() @ w.double()).float()
    assert not torch.equal(first, second)
    torch.testing.assert_close(second, want, rtol=1e-2 if precision == "tf32" else 1e-5, atol=1e-3)
