"""Winograd F(2x2, 3x3) convolution: Triton kernel, CPU PyTorch path and reference, side by side.

A 3x3, stride-1, padding-1 convolution computes every 2x2 output tile from a 4x4 input tile ``d``:

    Y = A^T [ (G g G^T) * (B^T d B) ] A                                   (Lavin & Gray 2016, eq. 8)

with ``*`` the element-wise product over the 16 positions of the 4x4 transformed tile, summed over input
channels. Summing over channels turns the element-wise products into 16 independent GEMMs
``M[i] = V[i] @ U[i]`` (tiles x C) @ (C x K), so a tile costs 16 multiplies per (c, k) pair where direct
convolution needs 4 * 9 = 36 (2.25x fewer).

    B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
    G   = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]
    A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]

The transformed input ``V`` is 4x larger than the input (16 values per 4 new pixels), so the Triton kernel
never writes it: each program loads 4x4 input tiles for a block of tiles and channels, transforms them in
registers, feeds the 16 ``tl.dot`` calls and applies the output transform before one store. Weights are
transformed once by :func:`transform_weight` (callers cache the result).

Optionally the kernel applies a per-(sample, channel) affine map and SiLU to every loaded input value --
that is how :mod:`fastdiff.kernels.fused_norm_conv` fuses GroupNorm+SiLU into the convolution. Zero padding
is applied *after* the activation (padded taps are 0, not ``silu(shift)``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._triton_compat import HAS_TRITON, check_triton_device, interpreting, tl, triton

if HAS_TRITON:
    from ._triton_compat import round_bf16_rne

# fmt: off
B_T = torch.tensor([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=torch.float64)
G = torch.tensor([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=torch.float64)
A_T = torch.tensor([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=torch.float64)
# fmt: on

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------------------------
# Weight transform (shared by every backend)
# ---------------------------------------------------------------------------------------------------------
def transform_weight(weight: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``U = G g G^T`` for every (k, c) filter, laid out as (16, C, K) for row-major tile GEMMs.

    Computed in fp32 (fp64 for fp64 weights) and rounded once to ``dtype`` (default: the weight's dtype).
    """
    if weight.dim() != 4 or tuple(weight.shape[2:]) != (3, 3):
        raise ValueError(f"Winograd F(2x2,3x3) needs a (K, C, 3, 3) weight, got shape {tuple(weight.shape)}")
    dtype = dtype or weight.dtype
    work = torch.float64 if weight.dtype == torch.float64 else torch.float32
    g = G.to(device=weight.device, dtype=work)
    u = torch.einsum("ai,kcij,bj->abck", g, weight.detach().to(work), g)
    return u.reshape(16, weight.shape[1], weight.shape[0]).to(dtype).contiguous()


def _check_conv_inputs(x: torch.Tensor, u: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() != 4:
        raise ValueError(f"input must be 4-D (N, C, H, W), got shape {tuple(x.shape)}")
    if u.dim() != 3 or u.shape[0] != 16:
        raise ValueError(
            f"transformed weight must be (16, C, K) from transform_weight(), got {tuple(u.shape)}"
        )
    if u.shape[1] != x.shape[1]:
        raise ValueError(f"input has {x.shape[1]} channels but the weight expects {u.shape[1]}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != u.shape[2]):
        raise ValueError(f"bias must have shape ({u.shape[2]},), got {tuple(bias.shape)}")


# ---------------------------------------------------------------------------------------------------------
# CPU / generic PyTorch Winograd: batched GEMM over the 16 transformed planes
# ---------------------------------------------------------------------------------------------------------
def winograd_conv2d_torch(x: torch.Tensor, u: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Winograd F(2x2,3x3) conv in plain PyTorch (any device, differentiable in ``x``).

    ``u`` is :func:`transform_weight` output. The input transform is done with strided slices of the padded
    NHWC input (no 4x4 matrix products), the 16 GEMMs with one ``torch.bmm`` and the output transform with
    strided writes. Returns the output in the input's memory format.
    """
    _check_conv_inputs(x, u, bias)
    n, c, h, w = x.shape
    k = u.shape[2]
    th, tw = (h + 1) // 2, (w + 1) // 2
    # pad to 2*th + 2 rows / 2*tw + 2 cols: 1 on the top/left, the rest (1 or 2) at the bottom/right
    xp = F.pad(x, (1, 2 * tw + 1 - w, 1, 2 * th + 1 - h)).permute(0, 2, 3, 1)  # NHWC view
    # B^T d: combine the 4 input rows of every tile (strided row slices, full width)
    rows = [xp[:, i : i + 2 * th : 2] for i in range(4)]
    r = (rows[0] - rows[2], rows[1] + rows[2], rows[2] - rows[1], rows[1] - rows[3])
    # (B^T d) B: combine columns, writing straight into the GEMM operand
    v = x.new_empty((16, n, th, tw, c))
    for i in range(4):
        cols = [r[i][:, :, j : j + 2 * tw : 2] for j in range(4)]
        torch.sub(cols[0], cols[2], out=v[4 * i + 0])
        torch.add(cols[1], cols[2], out=v[4 * i + 1])
        torch.sub(cols[2], cols[1], out=v[4 * i + 2])
        torch.sub(cols[1], cols[3], out=v[4 * i + 3])
    m = torch.bmm(v.view(16, n * th * tw, c), u.to(x.dtype)).view(4, 4, n, th, tw, k)
    # A^T M A
    o0 = m[0] + m[1] + m[2]
    o1 = m[1] - m[2] - m[3]
    y = x.new_empty((n, th, 2, tw, 2, k))
    for a, o in enumerate((o0, o1)):
        torch.add(o[0] + o[1], o[2], out=y[:, :, a, :, 0])
        torch.sub(o[1] - o[2], o[3], out=y[:, :, a, :, 1])
    y = y.view(n, 2 * th, 2 * tw, k)[:, :h, :w].permute(0, 3, 1, 2)
    if bias is not None:
        y = y + bias.to(y.dtype).view(1, k, 1, 1)
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return y.contiguous(memory_format=torch.channels_last)
    return y.contiguous()


def winograd_conv2d_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """Textbook Winograd (explicit 4x4 matrix products per tile, float64) -- for tests only."""
    x64, w64 = x.double(), weight.double()
    n, c, h, w = x.shape
    th, tw = (h + 1) // 2, (w + 1) // 2
    xp = F.pad(x64, (1, 2 * tw + 1 - w, 1, 2 * th + 1 - h))
    d = xp.unfold(2, 4, 2).unfold(3, 4, 2)  # (N, C, th, tw, 4, 4)
    bt, g, at = B_T.to(x.device), G.to(x.device), A_T.to(x.device)
    v = bt @ d @ bt.T
    uu = g @ w64 @ g.T  # (K, C, 4, 4)
    mm = torch.einsum("nctwij,kcij->nktwij", v, uu)
    y = at @ mm @ at.T  # (N, K, th, tw, 2, 2)
    y = y.permute(0, 1, 2, 4, 3, 5).reshape(n, weight.shape[0], 2 * th, 2 * tw)[:, :, :h, :w]
    if bias is not None:
        y = y + bias.double().view(1, -1, 1, 1)
    return y


# ---------------------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit
    def _load_tap(x_ptr, x_base, c_off, cp_mask, h, w, H, W, sxh, sxw, scale, shift, FUSE_NORM: tl.constexpr):
        """One input pixel for a block of tiles x channels, optionally normalised + SiLU, zero outside."""
        inside = (h >= 0) & (h < H) & (w >= 0) & (w < W)
        mask = cp_mask & inside[:, None]
        ptrs = x_ptr + (x_base + h.to(tl.int64) * sxh + w.to(tl.int64) * sxw)[:, None] + c_off[None, :]
        v = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        if FUSE_NORM:
            v = v * scale + shift
            v = v * tl.sigmoid(v)
            v = tl.where(mask, v, 0.0)  # padding is zero AFTER the activation
        return v

    @triton.jit
    def _bt_combine(d0, d1, d2, d3):
        """The B^T combination along one axis: (d0 - d2, d1 + d2, d2 - d1, d1 - d3)."""
        return d0 - d2, d1 + d2, d2 - d1, d1 - d3

    @triton.jit
    def _tile_gemm(
        acc, v, u_ptr, idx, CK, u_offs, u_mask,
        DOT_DTYPE: tl.constexpr, IEEE: tl.constexpr, EMULATE_BF16: tl.constexpr,
    ):  # fmt: skip
        """acc += V[idx] @ U[idx] with fp32 accumulation."""
        u = tl.load(u_ptr + idx * CK + u_offs, mask=u_mask, other=0.0)
        if EMULATE_BF16:  # interpreter: bf16 operands as exactly-rounded fp32 values, fp32 dot
            return tl.dot(round_bf16_rne(v), u.to(tl.float32), acc, input_precision="ieee")
        elif IEEE:
            return tl.dot(v, u.to(tl.float32), acc, input_precision="ieee")
        else:
            return tl.dot(v.to(DOT_DTYPE), u.to(DOT_DTYPE), acc)

    @triton.jit
    def _winograd_f2x3_kernel(
        x_ptr, u_ptr, bias_ptr, y_ptr, scale_ptr, shift_ptr,
        N, C, H, W, K, TH, TW,
        sxn, sxc, sxh, sxw,
        syn, syc, syh, syw,
        HAS_BIAS: tl.constexpr, FUSE_NORM: tl.constexpr,
        DOT_DTYPE: tl.constexpr, IEEE: tl.constexpr, EMULATE_BF16: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        pid_p = tl.program_id(0)
        pid_k = tl.program_id(1)
        p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)  # tile index over N * TH * TW
        k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        p_mask = p < N * TH * TW
        k_mask = k < K
        n = p // (TH * TW)
        t = p % (TH * TW)
        h0 = (t // TW) * 2 - 1  # top-left input pixel of the 4x4 tile (padding 1)
        w0 = (t % TW) * 2 - 1
        x_base = n.to(tl.int64) * sxn
        CK = C * K

        z = tl.zeros([BLOCK_P, BLOCK_K], dtype=tl.float32)
        a00, a01, a02, a03 = z, z, z, z
        a10, a11, a12, a13 = z, z, z, z
        a20, a21, a22, a23 = z, z, z, z
        a30, a31, a32, a33 = z, z, z, z

        for c0 in range(0, C, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            c_mask = c < C
            cp_mask = p_mask[:, None] & c_mask[None, :]
            c_off = c.to(tl.int64) * sxc
            if FUSE_NORM:
                nc = n[:, None] * C + c[None, :]
                scale = tl.load(scale_ptr + nc, mask=cp_mask, other=0.0)
                shift = tl.load(shift_ptr + nc, mask=cp_mask, other=0.0)
            else:
                scale = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
                shift = scale

            # the 4x4 input tile, column by column; B^T along rows right after each column is loaded
            ww = w0 + 0
            r00, r10, r20, r30 = _bt_combine(
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 0, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 1, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 2, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 3, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
            )
            ww = w0 + 1
            r01, r11, r21, r31 = _bt_combine(
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 0, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 1, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 2, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 3, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
            )
            ww = w0 + 2
            r02, r12, r22, r32 = _bt_combine(
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 0, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 1, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 2, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 3, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
            )
            ww = w0 + 3
            r03, r13, r23, r33 = _bt_combine(
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 0, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 1, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 2, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
                _load_tap(x_ptr, x_base, c_off, cp_mask, h0 + 3, ww, H, W, sxh, sxw, scale, shift, FUSE_NORM),
            )

            u_offs = c[:, None] * K + k[None, :]
            u_mask = c_mask[:, None] & k_mask[None, :]
            # (B^T d) B along columns, each transformed plane consumed by its GEMM right away
            v0, v1, v2, v3 = _bt_combine(r00, r01, r02, r03)
            a00 = _tile_gemm(a00, v0, u_ptr, 0, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a01 = _tile_gemm(a01, v1, u_ptr, 1, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a02 = _tile_gemm(a02, v2, u_ptr, 2, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a03 = _tile_gemm(a03, v3, u_ptr, 3, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            v0, v1, v2, v3 = _bt_combine(r10, r11, r12, r13)
            a10 = _tile_gemm(a10, v0, u_ptr, 4, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a11 = _tile_gemm(a11, v1, u_ptr, 5, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a12 = _tile_gemm(a12, v2, u_ptr, 6, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a13 = _tile_gemm(a13, v3, u_ptr, 7, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            v0, v1, v2, v3 = _bt_combine(r20, r21, r22, r23)
            a20 = _tile_gemm(a20, v0, u_ptr, 8, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a21 = _tile_gemm(a21, v1, u_ptr, 9, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a22 = _tile_gemm(a22, v2, u_ptr, 10, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a23 = _tile_gemm(a23, v3, u_ptr, 11, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            v0, v1, v2, v3 = _bt_combine(r30, r31, r32, r33)
            a30 = _tile_gemm(a30, v0, u_ptr, 12, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a31 = _tile_gemm(a31, v1, u_ptr, 13, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a32 = _tile_gemm(a32, v2, u_ptr, 14, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)
            a33 = _tile_gemm(a33, v3, u_ptr, 15, CK, u_offs, u_mask, DOT_DTYPE, IEEE, EMULATE_BF16)

        # A^T M A: first combine rows (index i), then columns (index j)
        o00 = a00 + a10 + a20
        o01 = a01 + a11 + a21
        o02 = a02 + a12 + a22
        o03 = a03 + a13 + a23
        o10 = a10 - a20 - a30
        o11 = a11 - a21 - a31
        o12 = a12 - a22 - a32
        o13 = a13 - a23 - a33
        y00 = o00 + o01 + o02
        y01 = o01 - o02 - o03
        y10 = o10 + o11 + o12
        y11 = o11 - o12 - o13
        if HAS_BIAS:
            b = tl.load(bias_ptr + k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
            y00 += b
            y01 += b
            y10 += b
            y11 += b

        if EMULATE_BF16:  # the interpreter's bf16 store truncates; round to nearest-even first
            y00 = round_bf16_rne(y00)
            y01 = round_bf16_rne(y01)
            y10 = round_bf16_rne(y10)
            y11 = round_bf16_rne(y11)

        oh = h0 + 1
        ow = w0 + 1
        y_base = (n.to(tl.int64) * syn)[:, None] + (k.to(tl.int64) * syc)[None, :]
        pk_mask = p_mask[:, None] & k_mask[None, :]
        out_ty = y_ptr.dtype.element_ty
        for_rows = (oh < H)[:, None]
        for_rows1 = (oh + 1 < H)[:, None]
        for_cols = (ow < W)[:, None]
        for_cols1 = (ow + 1 < W)[:, None]
        row0 = (oh.to(tl.int64) * syh)[:, None]
        row1 = ((oh + 1).to(tl.int64) * syh)[:, None]
        col0 = (ow.to(tl.int64) * syw)[:, None]
        col1 = ((ow + 1).to(tl.int64) * syw)[:, None]
        tl.store(y_ptr + y_base + row0 + col0, y00.to(out_ty), mask=pk_mask & for_rows & for_cols)
        tl.store(y_ptr + y_base + row0 + col1, y01.to(out_ty), mask=pk_mask & for_rows & for_cols1)
        tl.store(y_ptr + y_base + row1 + col0, y10.to(out_ty), mask=pk_mask & for_rows1 & for_cols)
        tl.store(y_ptr + y_base + row1 + col1, y11.to(out_ty), mask=pk_mask & for_rows1 & for_cols1)


_TL_DTYPES = {}
if HAS_TRITON:
    _TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}

    # On a GPU the block shape is tuned once per (C, K, H, W): 16 fp32 accumulators of BLOCK_P x BLOCK_K and
    # 16 transformed input tiles of BLOCK_P x BLOCK_C share the register file, so the space stays small.
    _winograd_f2x3_autotuned = triton.autotune(
        configs=[
            triton.Config({"BLOCK_P": bp, "BLOCK_K": bk, "BLOCK_C": bc}, num_warps=w, num_stages=s)
            for bp, bk, bc, w, s in [
                (32, 32, 16, 4, 2),
                (64, 32, 16, 4, 2),
                (32, 64, 16, 4, 2),
                (64, 64, 16, 8, 2),
                (32, 32, 32, 4, 2),
                (16, 64, 32, 4, 2),
            ]
        ],
        key=["C", "K", "H", "W"],
    )(_winograd_f2x3_kernel)


def _block_sizes(c: int, k: int, tiles: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_P, BLOCK_K, BLOCK_C, num_warps). 16 fp32 accumulators of BLOCK_P x BLOCK_K live in registers,
    so blocks stay small; tl.dot needs every dimension >= 16."""
    if device.type != "cuda":  # interpreter: fewer, larger programs run faster
        return 16, 32 if k > 16 else 16, 32 if c > 16 else 16, 4
    return 32, 32 if k > 16 else 16, 16, 4


def winograd_conv2d_triton(
    x: torch.Tensor,
    u: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_scale: torch.Tensor | None = None,
    norm_shift: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    block_sizes: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """Launch the fused Winograd kernel. ``u`` comes from :func:`transform_weight` (in ``x.dtype``).

    With ``norm_scale``/``norm_shift`` (fp32, shape (N, C)) every input value becomes
    ``silu(x * scale[n, c] + shift[n, c])`` before the transform (padding stays zero).
    The output keeps the input's memory format (NCHW or channels_last); any strides are accepted.
    """
    _check_conv_inputs(x, u, bias)
    check_triton_device(x, u, bias)
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"Winograd Triton kernel supports {SUPPORTED_DTYPES}, got {x.dtype}")
    n, c, h, w = x.shape
    k = u.shape[2]
    th, tw = (h + 1) // 2, (w + 1) // 2
    fuse = norm_scale is not None
    if fuse != (norm_shift is not None):
        raise ValueError("norm_scale and norm_shift must be given together")
    if fuse and (tuple(norm_scale.shape) != (n, c) or tuple(norm_shift.shape) != (n, c)):
        raise ValueError(f"norm_scale/norm_shift must have shape ({n}, {c})")
    if out is None:
        fmt = torch.channels_last if (x.stride(1) == 1 and c > 1) else torch.contiguous_format
        out = torch.empty((n, k, h, w), device=x.device, dtype=x.dtype, memory_format=fmt)
    u = u.to(x.dtype).contiguous()
    dummy = u  # never dereferenced when the matching flag is off
    args = (
        x, u, bias if bias is not None else dummy, out,
        norm_scale.contiguous() if fuse else dummy, norm_shift.contiguous() if fuse else dummy,
        n, c, h, w, k, th, tw,
        *x.stride(), *out.stride(),
    )  # fmt: skip
    flags = dict(
        HAS_BIAS=bias is not None,
        FUSE_NORM=fuse,
        DOT_DTYPE=_TL_DTYPES[x.dtype],
        IEEE=x.dtype == torch.float32,
        EMULATE_BF16=x.dtype == torch.bfloat16 and interpreting(),
    )
    tiles = n * th * tw
    if block_sizes is None and x.device.type == "cuda" and not interpreting():
        grid = lambda meta: (triton.cdiv(tiles, meta["BLOCK_P"]), triton.cdiv(k, meta["BLOCK_K"]))
        _winograd_f2x3_autotuned[grid](*args, **flags)
        return out
    bp, bk, bc, warps = block_sizes or _block_sizes(c, k, tiles, x.device)
    grid = (triton.cdiv(tiles, bp), triton.cdiv(k, bk))
    _winograd_f2x3_kernel[grid](*args, **flags, BLOCK_P=bp, BLOCK_K=bk, BLOCK_C=bc, num_warps=warps)
    return out
