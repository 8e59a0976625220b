"""The compiled CPU bank (tsconv.kernels.filterbank_native): the torch path's bits on every kind it takes, at
every channel count, dilation, row count and input layout, on any number of threads; what it leaves to
torch ops; and what happens without a compiler. (Its accuracy against a float64 reference is checked with
the torch path's in test_filterbank.py: the "native" cases.)"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tsconv import config, native
from tsconv.kernels import filterbank_native as fbn
from tsconv.kernels.filterbank import bank_halo, filter_bank
from tsconv.pipeline.filters import filter_spec

from .test_filterbank import prices

if fbn.native_bank() is None:
    pytest.skip(f"no native bank here: {fbn.unavailable_reason()}", allow_module_level=True)

BANKS = {
    "default": ("diff:1", "diff:32", "diff:256", "dev:32", "dev:256"),
    # windows of several ladder levels (20, 7, 300, 1000, 33), moments at odd lengths, repeated windows
    "mixed": (
        "id",
        "lag:3",
        "diff:1",
        "ma:7",
        "dev:7",
        "std:20",
        "zscore:20",
        "std:2",
        "zscore:33",
        "ma:300",
        "dev:1000",
        "std:256",
    ),  # fmt: skip
}


def _bank(specs: tuple[str, ...]) -> tuple:
    return tuple(filter_spec(s) for s in specs)


def _torch_ops(x: torch.Tensor, bank: tuple, d: int) -> torch.Tensor:
    with config.override(native_bank=False):
        return filter_bank(x, bank, dilation=d)


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Equal bit for bit, NaNs in the same places (NaN payloads aside: x86 keeps an operand's payload, and the
    two paths may order a NaN sum's operands differently)."""
    g, w = got.numpy(), want.numpy()
    assert g.shape == w.shape, what
    gn, wn = np.isnan(g), np.isnan(w)
    assert np.array_equal(gn, wn), f"{what}: NaN patterns differ"
    assert np.array_equal(g[~gn].view(np.uint32), w[~wn].view(np.uint32)), (
        f"{what}: max difference {np.abs(g[~gn] - w[~wn]).max()}"
    )


def _hard_prices(rows: int, cols: int, seed: int) -> np.ndarray:
    """Prices with a late start, gaps, +-inf and a -1e30 print (reaching only the windows that hold them)."""
    x = prices(rows, cols, seed=seed)
    x[rows // 2, cols - 1] = -1e30
    return x


def _noise(rows: int, cols: int, seed: int) -> np.ndarray:
    """Values of many magnitudes and both signs, whose float64 sums round (on prices they are exact in any
    order, so only this data tells an operation order apart from torch's)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-8, 8, size=(rows, cols)))
    x[rows // 3, 0] = np.nan
    return x.astype(np.float32)


@pytest.mark.parametrize("name", list(BANKS))
@pytest.mark.parametrize("d", [1, 3])
@pytest.mark.parametrize("cols", [4, 5, 13, 16, 20, 36, 40, 44, 70, 100])
@pytest.mark.parametrize("data", [_hard_prices, _noise], ids=["prices", "noise"])
def test_the_torch_paths_bits(name: str, d: int, cols: int, data) -> None:  # noqa: ANN001
    """Channel counts below, at and past a block of 16 (the last block overlaps the one before by 1 to 15
    channels) and past a group of 64 channels (70, 100)."""
    bank = _bank(BANKS[name])
    x = torch.from_numpy(data(3000 + bank_halo(bank, d), cols, seed=cols + d))
    _assert_same_bits(filter_bank(x, bank, dilation=d), _torch_ops(x, bank, d), f"{name} d={d} C={cols}")


@pytest.mark.parametrize("name", list(BANKS))
@pytest.mark.parametrize("d", [1, 3])
@pytest.mark.parametrize("cols", [4, 13, 40, 70])
@pytest.mark.parametrize("data", [_hard_prices, _noise], ids=["prices", "noise"])
def test_float64_inputs_give_the_torch_paths_bits(name: str, d: int, cols: int, data) -> None:  # noqa: ANN001
    """A float64 input is read as it is (values float32 does not hold: the float32 data moved by a part of an
    ulp), so its differences and deviations are those of its own values."""
    bank = _bank(BANKS[name])
    rng = np.random.default_rng(cols)
    x32 = data(3000 + bank_halo(bank, d), cols, seed=cols + d).astype(np.float64)
    x = torch.from_numpy(x32 * (1 + rng.uniform(-3e-8, 3e-8, size=x32.shape)))
    got = filter_bank(x, bank, dilation=d)
    _assert_same_bits(got, _torch_ops(x, bank, d), f"{name} d={d} C={cols}")
    assert not np.array_equal(got.numpy(), filter_bank(x.float(), bank, dilation=d).numpy())


@pytest.mark.parametrize("layout", ["fortran", "column slice", "row slice"])
def test_strided_inputs(layout: str) -> None:
    bank = _bank(BANKS["mixed"])
    base = _hard_prices(2500 + bank_halo(bank, 1), 30, seed=7)
    if layout == "fortran":
        x = torch.from_numpy(np.asfortranarray(base))
    elif layout == "column slice":
        x = torch.from_numpy(base)[:, 3:25]
    else:
        x = torch.from_numpy(base)[::2]
    _assert_same_bits(filter_bank(x, bank), _torch_ops(x, bank, 1), layout)


@pytest.mark.parametrize("name", list(BANKS))
@pytest.mark.parametrize("cols", [5, 40])
def test_feature_major_outputs(name: str, cols: int) -> None:
    """Into rows of a feature-major buffer (a polars frame's columns, each contiguous, with room beyond the rows
    written): the row-major result's bits, and nothing outside those rows written."""
    bank = _bank(BANKS[name])
    x = torch.from_numpy(_hard_prices(2500 + bank_halo(bank, 1), cols, seed=cols))
    want = filter_bank(x, bank)
    buf = torch.full((cols * len(bank), 2500 + 300), 7.0)
    got = filter_bank(x, bank, out=buf[:, 100:2600].T)
    assert got.data_ptr() == buf[:, 100:2600].T.data_ptr()
    _assert_same_bits(buf[:, 100:2600].T.contiguous(), want, f"{name} C={cols}")
    assert (buf[:, :100] == 7.0).all() and (buf[:, 2600:] == 7.0).all()


@pytest.mark.parametrize("rows", [1, 2, 255, 4097, 40_000])
def test_row_counts_and_threads(rows: int) -> None:
    """Outputs of a single row up to many tasks of rows, on one thread and on four: the same bits."""
    bank = _bank(BANKS["default"])
    x = torch.from_numpy(_hard_prices(rows + bank_halo(bank, 1), 20, seed=rows))
    want = _torch_ops(x, bank, 1)
    before = torch.get_num_threads()
    try:
        for threads in (1, 4):
            torch.set_num_threads(threads)
            _assert_same_bits(filter_bank(x, bank), want, f"{rows} rows, {threads} threads")
    finally:
        torch.set_num_threads(before)


def test_what_it_takes() -> None:
    nb = fbn.NativeBank
    assert nb.covers(_bank(BANKS["mixed"]), 4)
    assert not nb.covers(_bank(BANKS["mixed"]), 3)  # blocks of 4 channels at least: torch ops below
    assert not nb.covers(_bank(("diff:1", "ret:1")), 40)  # a logarithm C and torch may round apart
    assert not nb.covers(_bank(("ema:8",)), 40)
    # what it does not take still runs, on torch ops
    x = torch.from_numpy(_hard_prices(500, 3, seed=1))
    bank = _bank(("diff:1", "ret:1", "ema:8"))
    assert torch.equal(filter_bank(x, bank).isnan(), _torch_ops(x, bank, 1).isnan())


@pytest.fixture
def reloaded() -> Iterator[None]:
    """The library loaded again at its next use, as by a new process, and again after the test."""
    fbn.LIBRARY.forget()
    yield
    fbn.LIBRARY.forget()


def test_the_setting_off_and_no_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reloaded: None
) -> None:
    with config.override(native_bank=False):
        assert fbn.native_bank() is None and fbn.unavailable_reason() == "the native_bank setting is off"
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path / "cache"))  # nothing built there yet
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    assert fbn.native_bank() is None
    assert "no C compiler" in fbn.unavailable_reason()
    x = torch.from_numpy(_hard_prices(800, 8, seed=2))
    bank = _bank(BANKS["default"])
    fbn.LIBRARY.forget()
    got = filter_bank(x, bank)  # the torch path, the same result
    monkeypatch.undo()
    fbn.LIBRARY.forget()
    _assert_same_bits(got, _torch_ops(x, bank, 1), "without a compiler")


def test_a_compiler_setting_with_fast_math_gives_the_same_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reloaded: None
) -> None:
    """CC is a command with its arguments (CC='gcc -ffast-math', a site's default): its fast-math took the
    bank's NaN checks out (-ffinite-math-only), and outputs whose windows held a NaN or an infinity were
    numbers where the torch path gives NaN, silently. The bank's own flags turn fast-math off after CC's."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here")
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", f"{cc} -ffast-math")
    bank = _bank(BANKS["mixed"])
    x = torch.from_numpy(_noise(3000 + bank_halo(bank, 1), 8, seed=0))
    x[1500, 1], x[100:200, 2] = math.inf, math.nan
    assert fbn.native_bank() is not None, fbn.unavailable_reason()
    _assert_same_bits(filter_bank(x, bank), _torch_ops(x, bank, 1), "CC with -ffast-math")


def test_a_cache_shared_by_two_cpus_keeps_a_library_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """-march=native libraries are keyed by the CPU's flags."""
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path))
    src = Path(fbn.__file__).with_name("filterbank_native.c")
    for cpu in ("a", "b", "a"):
        lib, why = native.build_library(src, flags=("-O1",), machine=cpu)
        assert lib is not None, why
    assert len(list(tmp_path.glob("filterbank_native-*.so"))) == 2


def test_a_compiler_that_cannot_start_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # each run left an empty tmp*.so in the cache directory
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    src = Path(fbn.__file__).with_name("filterbank_native.c")
    lib, why = native.build_library(src, flags=("-O1",), machine="x")
    assert lib is None and "cannot build" in why
    assert list(tmp_path.iterdir()) == []


def test_a_cache_directory_that_cannot_be_made_is_said_once_not_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache directory below a file: no "compiling ... cached in DIR" (nothing would be), but the reason,
    once, with the setting that takes the slower path quietly; the bank still gives its bits."""
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("TSCONV_CACHE_DIR", str(tmp_path / "afile" / "sub"))
    fbn.LIBRARY.forget()
    x = torch.from_numpy(np.random.default_rng(3).normal(100.0, 1.0, (500, 4)).astype(np.float32))
    bank = tuple(filter_spec(s) for s in ("diff:1", "dev:32"))
    with caplog.at_level(logging.WARNING, logger="tsconv.native"):
        got = filter_bank(x, bank)
        filter_bank(x, bank)
    monkeypatch.undo()
    fbn.LIBRARY.forget()
    said = [r.getMessage() for r in caplog.records]
    assert not any("compiling" in m for m in said), said
    assert (
        len(said) == 1
        and "cannot create the cache directory" in said[0]
        and "TSCONV_NATIVE_BANK=0" in said[0]
    )
    _assert_same_bits(got, _torch_ops(x, bank, 1), "without a cache directory")
