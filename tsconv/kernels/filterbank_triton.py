"""The Triton kernels of a filter bank (:mod:`tsconv.kernels.filterbank`): its three operations over
[rows, channels] float64 tiles, for CUDA tensors (and CPU tensors under ``TRITON_INTERPRET=1``).

The bank imports this module only when it runs these kernels, so a CPU run needs no Triton. The operations
and their rounding are the torch path's (``_TorchOps`` there); what each computes is documented on the
bank's ``_Ops``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["TritonOps"]

_KIND = {"id": 0, "lag": 1, "diff": 2, "ret": 3, "ma": 4, "dev": 5, "std": 6, "zscore": 7, "ema": 8}

_BLOCK_T = 64
_BLOCK_C = 32


@triton.jit
def _axpy_kernel(a_ptr, b_ptr, o_ptr, n, C, sa, sb, so, w, WEIGHTED: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    mask = (rows < n) & (cols < C)
    a = tl.load(a_ptr + rows * sa + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + rows * sb + cols, mask=mask, other=0.0)
    if WEIGHTED:
        a = a * w
    tl.store(o_ptr + rows * so + cols, a + b, mask=mask)


@triton.jit
def _merge_kernel(sa_ptr, ma_ptr, sb_ptr, mb_ptr, o_ptr, n, C, s_sa, s_ma, s_sb, s_mb, so, ia, ib, coef,
                  HAS_MA: tl.constexpr, HAS_MB: tl.constexpr, BLOCK_T: tl.constexpr,
                  BLOCK_C: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    mask = (rows < n) & (cols < C)
    sa = tl.load(sa_ptr + rows * s_sa + cols, mask=mask, other=0.0)
    sb = tl.load(sb_ptr + rows * s_sb + cols, mask=mask, other=0.0)
    delta = sb * ib - sa * ia
    acc = delta * delta * coef
    if HAS_MA and HAS_MB:
        acc += tl.load(ma_ptr + rows * s_ma + cols, mask=mask, other=0.0) + tl.load(
            mb_ptr + rows * s_mb + cols, mask=mask, other=0.0
        )
    elif HAS_MA:
        acc += tl.load(ma_ptr + rows * s_ma + cols, mask=mask, other=0.0)
    elif HAS_MB:
        acc += tl.load(mb_ptr + rows * s_mb + cols, mask=mask, other=0.0)
    tl.store(o_ptr + rows * so + cols, acc, mask=mask)


@triton.jit
def _finish_kernel(x_ptr, y_ptr, m_ptr, o_ptr, n, C, sx, sy, sm, so_t, so_c, scale, inv_dof,
                   KIND: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    mask = (rows < n) & (cols < C)
    x = tl.load(x_ptr + rows * sx + cols, mask=mask, other=0.0)
    if KIND != 0:
        y = tl.load(y_ptr + rows * sy + cols, mask=mask, other=1.0)
    if KIND == 0:  # id
        v = x
    elif KIND == 1:  # lag
        v = y
    elif KIND == 2:  # diff
        v = x - y
    elif KIND == 3:  # ret
        v = tl.where((x > 0) & (y > 0), tl.log(x / y), float("nan"))
    elif KIND == 4 or KIND == 8:  # ma, ema
        v = y * scale
    elif KIND == 5:  # dev
        v = x - y * scale
    else:  # std, zscore
        mm = tl.load(m_ptr + rows * sm + cols, mask=mask, other=1.0)
        sd = tl.sqrt(mm * inv_dof)
        if KIND == 6:
            v = tl.where(y - y == 0, sd, float("nan"))  # y - y is 0 exactly where y is finite
        else:
            z = (x - y * scale) / sd
            v = tl.where(sd > 0, z, float("nan"))
    tl.store(o_ptr + rows * so_t + cols * so_c, v.to(tl.float32), mask=mask)


def _grid(n: int, c: int) -> tuple[int, int]:
    return (triton.cdiv(n, _BLOCK_T), triton.cdiv(c, _BLOCK_C))


class TritonOps:
    """The same operations as Triton kernels over [rows, channels] float64 tiles (rows contiguous)."""

    def axpy(self, a, b, w):  # noqa: ANN001, ANN201
        n, c = a.shape
        out = torch.empty((n, c), dtype=torch.float64, device=a.device)
        _axpy_kernel[_grid(n, c)](a, b, out, n, c, a.stride(0), b.stride(0), out.stride(0),
                                  1.0 if w is None else float(w), WEIGHTED=w is not None,
                                  BLOCK_T=_BLOCK_T, BLOCK_C=_BLOCK_C)  # fmt: skip
        return out

    def merge(self, sa, ma, sb, mb, ia, ib, coef):  # noqa: ANN001, ANN201
        n, c = sa.shape
        out = torch.empty((n, c), dtype=torch.float64, device=sa.device)
        _merge_kernel[_grid(n, c)](
            sa, sa if ma is None else ma, sb, sb if mb is None else mb, out, n, c,
            sa.stride(0), sa.stride(0) if ma is None else ma.stride(0), sb.stride(0),
            sb.stride(0) if mb is None else mb.stride(0), out.stride(0), float(ia), float(ib), float(coef),
            HAS_MA=ma is not None, HAS_MB=mb is not None, BLOCK_T=_BLOCK_T, BLOCK_C=_BLOCK_C,
        )  # fmt: skip
        return out

    def finish(self, kind, dest, cur, y=None, m=None, *, scale=1.0, inv_dof=1.0):  # noqa: ANN001, ANN201
        n, c = cur.shape
        y_ = cur if y is None else y
        m_ = cur if m is None else m
        _finish_kernel[_grid(n, c)](
            cur, y_, m_, dest, n, c, cur.stride(0), y_.stride(0), m_.stride(0), dest.stride(0),
            dest.stride(1), float(scale), float(inv_dof), KIND=_KIND[kind], BLOCK_T=_BLOCK_T,
            BLOCK_C=_BLOCK_C,
        )  # fmt: skip
