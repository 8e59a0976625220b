"""Blosc-LZ4 frames built on the device (tsconv.kernels.lz4_encode) decode, through numcodecs' c-blosc and
tsconv's own GPU decoder, to exactly the rows encoded: compressible prices, incompressible bytes (raw
streams, memcpyed chunks), streams of both kinds in one chunk, odd row widths, several chunks at once.

On the CPU the LZ4 streams come from numcodecs' LZ4 (the framing kernel runs in Triton's interpreter); on a
GPU with nvCOMP installed, from nvCOMP (the test marked gpu)."""

from __future__ import annotations

import os

import numcodecs
import numpy as np
import pytest
import torch

from tsconv.kernels import blosc_header
from tsconv.kernels import lz4_encode as le

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERP or not torch.cuda.is_available() else "cuda"
pytestmark = pytest.mark.skipif(
    DEVICE == "cpu" and not INTERP, reason="needs a CUDA GPU or TRITON_INTERPRET=1"
)
POISON = 0xAB


class CpuLZ4:
    """numcodecs' LZ4 (raw blocks: its 4-byte size prefix dropped) standing in for nvCOMP on the CPU."""

    def __init__(self, neblock: int) -> None:
        self.neblock = neblock
        self.max_out = neblock + neblock // 255 + 16  # LZ4_compressBound
        self.calls = 0

    def __call__(self, src: torch.Tensor, per_row: int, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        self.calls += 1
        a = src.cpu().numpy()
        for i in range(a.shape[0] * per_row):
            r, s = divmod(i, per_row)
            enc = numcodecs.LZ4().encode(a[r, s * self.neblock : (s + 1) * self.neblock])[4:]
            dst[i, : len(enc)] = torch.from_numpy(np.frombuffer(enc, np.uint8).copy())
            sizes[i] = len(enc)


def _prices(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = 100 + np.cumsum(rng.choice([-1, 0, 0, 1], size=(rows, cols)), axis=0) * 0.01
    x[rng.random((rows, cols)) < 0.02] = np.nan
    return x.astype(np.float32)


def _encode(x: np.ndarray, chunk_rows: int, compressor=None) -> tuple[list[bytes], le.FrameLayout]:
    lay = le.frame_layout(chunk_rows=chunk_rows, row_bytes=x.shape[1] * 4)
    k = x.shape[0] // chunk_rows
    comp = compressor or (CpuLZ4(lay.neblock) if DEVICE == "cpu" else None)
    enc = le.BloscEncoder(lay, max_chunks=k + 1, device=torch.device(DEVICE), compressor=comp)
    enc.frames.fill_(POISON)
    host = enc.encode(torch.from_numpy(x).to(DEVICE)).cpu().numpy()
    assert host.shape == (k, lay.frame_bytes)
    frames = [host[c, : blosc_header.parse_header(host[c]).cbytes].tobytes() for c in range(k)]
    return frames, lay


def _check_decodes(x: np.ndarray, chunk_rows: int, frames: list[bytes], lay: le.FrameLayout) -> None:
    for c, f in enumerate(frames):
        want = x[c * chunk_rows : (c + 1) * chunk_rows]
        h = blosc_header.parse_header(f)
        assert (h.nbytes, h.blocksize, h.typesize, h.cbytes) == (lay.chunk_bytes, lay.blocksize, 4, len(f))
        assert blosc_header.unsupported_reason(h, nbytes=lay.chunk_bytes, size=len(f), typesize=4) is None
        got = np.frombuffer(numcodecs.Blosc().decode(f), np.float32).reshape(want.shape)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(("rows", "cols", "chunk_rows"), [(128, 37, 64), (2048, 160, 1024), (192, 3, 64)])
def test_price_chunks_decode_to_the_rows_encoded(rows: int, cols: int, chunk_rows: int) -> None:
    x = _prices(rows, cols)
    frames, lay = _encode(x, chunk_rows)
    _check_decodes(x, chunk_rows, frames, lay)
    h = blosc_header.parse_header(frames[0])
    assert h.shuffle and h.split and not h.memcpyed and h.flags >> 5 == 1
    assert sum(map(len, frames)) < 0.8 * x.nbytes  # prices on a tick grid do shrink


def test_incompressible_chunks_are_stored_memcpyed() -> None:
    x = np.random.default_rng(1).integers(0, 2**32, size=(256, 24), dtype=np.uint32).view(np.float32)
    frames, lay = _encode(x, 128)
    _check_decodes(x, 128, frames, lay)
    assert all(blosc_header.parse_header(f).memcpyed for f in frames)
    assert all(len(f) == 16 + lay.chunk_bytes for f in frames)


def test_raw_and_compressed_streams_in_one_chunk() -> None:
    """Low bytes random, high bytes constant: after the shuffle two streams of each block shrink, two do not."""
    rng = np.random.default_rng(2)
    v = (rng.integers(0, 2**16, size=(512, 40), dtype=np.uint32) | np.uint32(0x3F800000)).view(np.float32)
    frames, lay = _encode(v, 512)
    _check_decodes(v, 512, frames, lay)
    assert not blosc_header.parse_header(frames[0]).memcpyed
    assert 16 + lay.chunk_bytes // 2 < len(frames[0]) < 16 + lay.chunk_bytes


def test_all_nan_chunks_shrink_and_decode() -> None:
    x = np.full((1024, 9), np.nan, np.float32)
    frames, lay = _encode(x, 512)
    _check_decodes(x, 512, frames, lay)
    assert all(len(f) < lay.chunk_bytes // 50 for f in frames)


def test_frames_decode_on_tsconv_gpu_decoder() -> None:
    """Two chunks of price rows, at their offsets in one buffer, decode on tsconv's decoder: four split streams
    a block, of 320 bytes (more than the decoder's 128-byte window). Interpreted, the decoder's time goes with
    the bytes it decodes (about 1 s a KB): small chunks; test_blosc_lz4.py covers the decoder itself."""
    from tsconv.kernels import blosc_lz4 as bl

    x = _prices(64, 10, seed=3)
    frames, lay = _encode(x, 32)
    assert len(frames) == 2 and lay.nblocks == 1 and lay.neblock == 320
    assert not any(blosc_header.parse_header(f).memcpyed for f in frames)
    offs, pos, pieces = [], 0, []
    for f in frames:
        offs.append(pos)
        pad = -len(f) % 16
        pieces.append(np.frombuffer(f + bytes(pad), np.uint8))
        pos += len(f) + pad
    out = torch.full((len(frames), lay.chunk_bytes), POISON, dtype=torch.uint8, device=DEVICE)
    err = bl.decode_chunks(
        torch.from_numpy(np.concatenate(pieces)).to(DEVICE),
        torch.tensor(offs, dtype=torch.int64, device=DEVICE),
        torch.tensor([len(f) for f in frames], dtype=torch.int64, device=DEVICE),
        out,
        typesize=4,
        max_blocks=lay.nblocks,
    )
    assert err.cpu().tolist() == [0] * len(frames)
    got = out.cpu().numpy().view(np.float32).reshape(x.shape)
    np.testing.assert_array_equal(got.view(np.uint32), x.view(np.uint32))


def test_layout_blocks_divide_the_chunk_and_stay_near_the_target() -> None:
    for chunk_rows, row_bytes in [(8192, 1920), (1024, 16384), (65536, 4), (25600, 640), (3072, 12)]:
        lay = le.frame_layout(chunk_rows=chunk_rows, row_bytes=row_bytes)
        assert lay.chunk_bytes % lay.blocksize == 0 and lay.blocksize % row_bytes == 0
        assert lay.blocksize <= max(le.TARGET_BLOCK, row_bytes)
        assert (
            lay.blocksize * 2 > le.TARGET_BLOCK
            or lay.blocksize * 2 > lay.chunk_bytes
            or (chunk_rows // (lay.blocksize // row_bytes)) % 2
        )
    with pytest.raises(ValueError, match="whole 4-byte values"):
        le.frame_layout(chunk_rows=10, row_bytes=6)
    with pytest.raises(
        ValueError, match="too small"
    ):  # streams of 96 bytes: c-blosc cannot decode them split
        le.frame_layout(chunk_rows=32, row_bytes=12)
    assert le.frame_layout(chunk_rows=4096, row_bytes=4).neblock >= le.MIN_STREAM


def test_an_encoder_refuses_partial_chunks() -> None:
    lay = le.frame_layout(chunk_rows=64, row_bytes=16)
    enc = le.BloscEncoder(lay, max_chunks=2, device=torch.device(DEVICE), compressor=CpuLZ4(lay.neblock))
    with pytest.raises(ValueError, match="whole chunks"):
        enc.encode(torch.zeros((65, 4), device=DEVICE))
    with pytest.raises(ValueError, match="holds 2"):
        enc.encode(torch.zeros((192, 4), device=DEVICE))


@pytest.mark.gpu
def test_nvcomp_frames_decode_on_numcodecs() -> None:
    if le.nvcomp_reason() is not None:
        pytest.skip(le.nvcomp_reason())
    x = _prices(8192 * 3, 160, seed=4)
    frames, lay = _encode(x, 8192, compressor=None)
    _check_decodes(x, 8192, frames, lay)
    assert sum(map(len, frames)) < 0.9 * x.nbytes


def test_an_nvcomp_that_fails_its_test_compression_leaves_the_encode_to_the_host(monkeypatch):
    """An nvCOMP built for a newer CUDA than the driver's fails every call: tsconv then encodes on the host
    instead of failing the run at its first step, and says why."""

    class Broken:
        def __init__(self, **kw):
            raise RuntimeError("nvCOMP LZ4 compress failed with status 10")

    monkeypatch.setattr(le, "nvcomp_reason", lambda: None)
    monkeypatch.setattr(le, "NvcompLZ4", Broken)
    monkeypatch.setattr(le, "_PROBED", {})
    reason = le.encode_reason(torch.device("cuda", 0))
    assert reason is not None and "failed a test compression" in reason and "status 10" in reason
    monkeypatch.setattr(le, "NvcompLZ4", lambda **kw: pytest.fail("probed twice"))
    assert le.encode_reason(torch.device("cuda", 0)) == reason  # once per process and device
