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

The Triton path is three kernels, each small enough to live in registers on sm_90a (zero spills in every
shipped config; see ``benchmarks/results/ptx_sm90.md``):

1. input transform: 4x4 input tiles -> ``V = B^T d B``, written as 16 planes ``V[i]`` of shape (tiles, C)
   in the input dtype (each value rounded once, as the one-kernel design's ``tl.dot`` operands were);
2. one batched GEMM ``M[i] = V[i] @ U[i]`` over the 16 planes (``tl.dot``, fp32 accumulation, wgmma on
   Hopper), ``M`` kept in fp32 so that the output transform's cancellations see unrounded products;
3. output transform ``Y = A^T M A`` plus bias, stored in the input's memory format.

Why not one kernel: fusing all three keeps 16 fp32 accumulator tiles plus 16 input tiles live per program;
for sm_90a ptxas spilled 0.8-10.6 KB per thread in every config of that design (255 registers, serialised
wgmma), which cannot beat cuDNN. The split costs the V and M round trips through memory (4x the input and
8x the output for half precision), which is why "auto" dispatch keeps cuDNN wherever it measures faster.
Weights are transformed once by :func:`transform_weight` (callers cache the result).

About 450 lines: the three kernels, the CPU path and the reference must agree on one tile and plane layout,
so they stay side by side; the input transform is written out tap by tap because Triton register tensors
cannot be indexed.

Optionally the input transform applies a per-(sample, channel) affine map and SiLU to every loaded value --
that is how :mod:`fastdiff.kernels.fused_norm_conv` fuses GroupNorm+SiLU into the convolution. Zero padding
is applied *after* the activation (padded taps are 0, not ``silu(shift)``).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ._triton_compat import HAS_TRITON, check_triton_device, tl, triton, triton_interpret

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
# Triton kernels: input transform -> batched GEMM over the 16 planes -> output transform (+ bias)
# ---------------------------------------------------------------------------------------------------------
# Shipped launch configurations. The compile report (benchmarks/ptx_report.py) compiles every one of them
# for sm_90a; tests run each under the interpreter. Transforms are memory-bound: one config each, sized so
# that the 16 live tiles take <= 64 fp32 registers per thread. The GEMM is autotuned on CUDA.
INPUT_CONFIGS = ({"BLOCK_P": 16, "BLOCK_C": 32, "num_warps": 4},)
OUTPUT_CONFIGS = ({"BLOCK_P": 32, "BLOCK_K": 32, "num_warps": 4},)
GEMM_CONFIGS = (
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3},
)
# the interpreter runs one numpy op per block: fewer, mid-sized programs are fastest
INTERPRETER_CONFIGS = {
    "input": {"BLOCK_P": 16, "BLOCK_C": 32, "num_warps": 4},
    "gemm": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 4, "num_stages": 1},
    "output": {"BLOCK_P": 16, "BLOCK_K": 32, "num_warps": 4},
}

if HAS_TRITON:

    @triton.jit
    def _load_tap(x_ptr, x_base, c_off, pc_mask, h, w, H, W, sxh, sxw, scale, shift, FUSE_NORM: tl.constexpr):
        """One input pixel for a block of tiles x channels, optionally normalised + SiLU, zero outside."""
        inside = (h >= 0) & (h < H) & (w >= 0) & (w < W)
        mask = pc_mask & inside[:, None]
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
    def _store_plane(v_ptr, i, PC, offs, mask, v, EMULATE_BF16: tl.constexpr):
        if EMULATE_BF16:  # the interpreter's bf16 store truncates; round to nearest-even first
            v = round_bf16_rne(v)
        tl.store(v_ptr + i * PC + offs, v.to(v_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _bt_column(
        x_ptr, x_base, c_off, pc_mask, h0, w, H, W, sxh, sxw, scale, shift, FUSE_NORM: tl.constexpr
    ):
        """B^T along the rows of input column ``w`` of the tiles: its 4 taps -> 4 values."""
        return _bt_combine(
            _load_tap(x_ptr, x_base, c_off, pc_mask, h0, w, H, W, sxh, sxw, scale, shift, FUSE_NORM),
            _load_tap(x_ptr, x_base, c_off, pc_mask, h0 + 1, w, H, W, sxh, sxw, scale, shift, FUSE_NORM),
            _load_tap(x_ptr, x_base, c_off, pc_mask, h0 + 2, w, H, W, sxh, sxw, scale, shift, FUSE_NORM),
            _load_tap(x_ptr, x_base, c_off, pc_mask, h0 + 3, w, H, W, sxh, sxw, scale, shift, FUSE_NORM),
        )

    @triton.jit
    def _store_row(v_ptr, ROW: tl.constexpr, PC, offs, mask, r0, r1, r2, r3, EMULATE_BF16: tl.constexpr):
        """B along row ``ROW`` of ``B^T d``: planes 4 * ROW + 0..3, each stored as soon as it is formed."""
        v0, v1, v2, v3 = _bt_combine(r0, r1, r2, r3)
        _store_plane(v_ptr, 4 * ROW + 0, PC, offs, mask, v0, EMULATE_BF16)
        _store_plane(v_ptr, 4 * ROW + 1, PC, offs, mask, v1, EMULATE_BF16)
        _store_plane(v_ptr, 4 * ROW + 2, PC, offs, mask, v2, EMULATE_BF16)
        _store_plane(v_ptr, 4 * ROW + 3, PC, offs, mask, v3, EMULATE_BF16)

    @triton.jit
    def _winograd_input_kernel(
        x_ptr, v_ptr, scale_ptr, shift_ptr,
        C, H, W, TH, TW, P,
        sxn, sxc, sxh, sxw,
        FUSE_NORM: tl.constexpr, EMULATE_BF16: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        """V[i, p, c] = (B^T d B)[i] for the 4x4 input tile d of tile p, channel c."""
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        pc_mask = (p < P)[:, None] & (c < C)[None, :]
        n = p // (TH * TW)
        t = p % (TH * TW)
        h0 = (t // TW) * 2 - 1  # top-left input pixel of the 4x4 tile (padding 1)
        w0 = (t % TW) * 2 - 1
        x_base = n.to(tl.int64) * sxn
        c_off = c.to(tl.int64) * sxc
        if FUSE_NORM:
            nc = n[:, None] * C + c[None, :]
            scale = tl.load(scale_ptr + nc, mask=pc_mask, other=0.0)
            shift = tl.load(shift_ptr + nc, mask=pc_mask, other=0.0)
        else:
            scale = 0.0
            shift = 0.0
        # B^T along rows, one input column at a time (4 taps -> 4 values)
        r00, r10, r20, r30 = _bt_column(
            x_ptr, x_base, c_off, pc_mask, h0, w0, H, W, sxh, sxw, scale, shift, FUSE_NORM
        )
        r01, r11, r21, r31 = _bt_column(
            x_ptr, x_base, c_off, pc_mask, h0, w0 + 1, H, W, sxh, sxw, scale, shift, FUSE_NORM
        )
        r02, r12, r22, r32 = _bt_column(
            x_ptr, x_base, c_off, pc_mask, h0, w0 + 2, H, W, sxh, sxw, scale, shift, FUSE_NORM
        )
        r03, r13, r23, r33 = _bt_column(
            x_ptr, x_base, c_off, pc_mask, h0, w0 + 3, H, W, sxh, sxw, scale, shift, FUSE_NORM
        )
        # B along columns; plane i = 4 * row + col, each stored as soon as it is formed
        PC = P.to(tl.int64) * C
        offs = p.to(tl.int64)[:, None] * C + c[None, :]
        _store_row(v_ptr, 0, PC, offs, pc_mask, r00, r01, r02, r03, EMULATE_BF16)
        _store_row(v_ptr, 1, PC, offs, pc_mask, r10, r11, r12, r13, EMULATE_BF16)
        _store_row(v_ptr, 2, PC, offs, pc_mask, r20, r21, r22, r23, EMULATE_BF16)
        _store_row(v_ptr, 3, PC, offs, pc_mask, r30, r31, r32, r33, EMULATE_BF16)

    @triton.jit
    def _winograd_gemm_kernel(
        v_ptr, u_ptr, m_ptr, P, C, K,
        UPCAST: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """M[i] = V[i] @ U[i] with V (16, P, C), U (16, C, K) in the input dtype and M (16, P, K) in fp32."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        i = tl.program_id(2).to(tl.int64)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = v_ptr + i * P * C + rm.to(tl.int64)[:, None] * C + rk[None, :]
        b_ptrs = u_ptr + i * C * K + rk.to(tl.int64)[:, None] * K + rn[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, C, BLOCK_K):
            a = tl.load(a_ptrs, mask=(rm[:, None] < P) & (rk[None, :] + k0 < C), other=0.0)
            b = tl.load(b_ptrs, mask=(rk[:, None] + k0 < C) & (rn[None, :] < K), other=0.0)
            if UPCAST:  # interpreter: half operands as exact fp32 values, fp32 dot
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            elif IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K * K
        m_ptrs = m_ptr + i * P * K + rm.to(tl.int64)[:, None] * K + rn[None, :]
        tl.store(m_ptrs, acc, mask=(rm[:, None] < P) & (rn[None, :] < K))

    @triton.jit
    def _at_column(m_ptr, j, PK, offs, mask):
        """Rows of A^T applied to column j of the 4x4 M tile: (m0 + m1 + m2, m1 - m2 - m3)."""
        m0 = tl.load(m_ptr + (0 + j) * PK + offs, mask=mask, other=0.0)
        m1 = tl.load(m_ptr + (4 + j) * PK + offs, mask=mask, other=0.0)
        m2 = tl.load(m_ptr + (8 + j) * PK + offs, mask=mask, other=0.0)
        m3 = tl.load(m_ptr + (12 + j) * PK + offs, mask=mask, other=0.0)
        return m0 + m1 + m2, m1 - m2 - m3

    @triton.jit
    def _winograd_output_kernel(
        m_ptr, bias_ptr, y_ptr,
        H, W, K, TH, TW, P,
        syn, syc, syh, syw,
        HAS_BIAS: tl.constexpr, EMULATE_BF16: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """Y = A^T M A (+ bias): the 2x2 output pixels of each tile, in the output's strides."""
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        p_mask = p < P
        k_mask = k < K
        pk_mask = p_mask[:, None] & k_mask[None, :]
        PK = P.to(tl.int64) * K
        offs = p.to(tl.int64)[:, None] * K + k[None, :]
        o00, o10 = _at_column(m_ptr, 0, PK, offs, pk_mask)
        o01, o11 = _at_column(m_ptr, 1, PK, offs, pk_mask)
        o02, o12 = _at_column(m_ptr, 2, PK, offs, pk_mask)
        o03, o13 = _at_column(m_ptr, 3, PK, offs, pk_mask)
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
        n = p // (TH * TW)
        t = p % (TH * TW)
        oh = (t // TW) * 2
        ow = (t % TW) * 2
        y_base = (n.to(tl.int64) * syn)[:, None] + (k.to(tl.int64) * syc)[None, :]
        row0 = (oh.to(tl.int64) * syh)[:, None]
        row1 = ((oh + 1).to(tl.int64) * syh)[:, None]
        col0 = (ow.to(tl.int64) * syw)[:, None]
        col1 = ((ow + 1).to(tl.int64) * syw)[:, None]
        in_r1 = (oh + 1 < H)[:, None]
        in_c1 = (ow + 1 < W)[:, None]
        out_ty = y_ptr.dtype.element_ty
        tl.store(y_ptr + y_base + row0 + col0, y00.to(out_ty), mask=pk_mask)
        tl.store(y_ptr + y_base + row0 + col1, y01.to(out_ty), mask=pk_mask & in_c1)
        tl.store(y_ptr + y_base + row1 + col0, y10.to(out_ty), mask=pk_mask & in_r1)
        tl.store(y_ptr + y_base + row1 + col1, y11.to(out_ty), mask=pk_mask & in_r1 & in_c1)

    # The GEMM is the only compute-bound part: on CUDA its block shape is tuned once per (P, C, K).
    _winograd_gemm_autotuned = triton.autotune(
        configs=[
            triton.Config(
                {k: v for k, v in cfg.items() if k.startswith("BLOCK")},
                num_warps=cfg["num_warps"],
                num_stages=cfg["num_stages"],
            )
            for cfg in GEMM_CONFIGS
        ],
        key=["P", "C", "K"],
    )(_winograd_gemm_kernel)


def _launch_opts(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k.startswith("BLOCK") or k in ("num_warps", "num_stages")}


def winograd_conv2d_triton(
    x: torch.Tensor,
    u: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_scale: torch.Tensor | None = None,
    norm_shift: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    configs: dict | None = None,
) -> torch.Tensor:
    """Winograd F(2x2,3x3) conv in three Triton launches. ``u`` comes from :func:`transform_weight`.

    With ``norm_scale``/``norm_shift`` (fp32, shape (N, C)) every input value becomes
    ``silu(x * scale[n, c] + shift[n, c])`` before the transform (padding stays zero).
    The output keeps the input's memory format (NCHW or channels_last); any input strides are accepted.
    ``configs`` ({"input": ..., "gemm": ..., "output": ...}, each a dict like those of :data:`INPUT_CONFIGS`,
    :data:`GEMM_CONFIGS`, :data:`OUTPUT_CONFIGS`; missing keys take the defaults) fixes the launch
    configurations; a given "gemm" config skips the CUDA autotuning, as does ``FASTDIFF_TRITON_AUTOTUNE=0``
    (which takes the first of :data:`GEMM_CONFIGS`: what ``benchmarks/gpu_check.sh`` uses to bound compiles).
    """
    _check_conv_inputs(x, u, bias)
    check_triton_device(x, u, bias)
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"Winograd Triton kernel supports {SUPPORTED_DTYPES}, got {x.dtype}")
    n, c, h, w = x.shape
    k = u.shape[2]
    th, tw = (h + 1) // 2, (w + 1) // 2
    tiles = n * th * tw
    fuse = norm_scale is not None
    if fuse != (norm_shift is not None):
        raise ValueError("norm_scale and norm_shift must be given together")
    if fuse and (tuple(norm_scale.shape) != (n, c) or tuple(norm_shift.shape) != (n, c)):
        raise ValueError(f"norm_scale/norm_shift must have shape ({n}, {c})")
    if out is None:
        fmt = torch.channels_last if (x.stride(1) == 1 and c > 1) else torch.contiguous_format
        out = torch.empty((n, k, h, w), device=x.device, dtype=x.dtype, memory_format=fmt)
    if tiles == 0 or k == 0:
        return out
    interp = triton_interpret()
    defaults = INTERPRETER_CONFIGS if interp else {"input": INPUT_CONFIGS[0], "output": OUTPUT_CONFIGS[0]}
    configs = {**defaults, **(configs or {})}
    emulate_bf16 = x.dtype == torch.bfloat16 and interp
    u = u.to(x.dtype).contiguous()
    v = torch.empty((16, tiles, c), device=x.device, dtype=x.dtype)
    m = torch.empty((16, tiles, k), device=x.device, dtype=torch.float32)

    cfg = configs["input"]
    scale = norm_scale.contiguous().float() if fuse else v  # never dereferenced unless FUSE_NORM
    shift = norm_shift.contiguous().float() if fuse else v
    grid = (triton.cdiv(tiles, cfg["BLOCK_P"]), triton.cdiv(c, cfg["BLOCK_C"]))
    _winograd_input_kernel[grid](
        x, v, scale, shift, c, h, w, th, tw, tiles, *x.stride(),
        FUSE_NORM=fuse, EMULATE_BF16=emulate_bf16, **_launch_opts(cfg),
    )  # fmt: skip

    flags = dict(UPCAST=interp and x.dtype != torch.float32, IEEE=x.dtype == torch.float32)
    if "gemm" not in configs and os.environ.get("FASTDIFF_TRITON_AUTOTUNE", "1") == "0":
        configs["gemm"] = GEMM_CONFIGS[0]  # check runs: one config per shape, one compile per dtype
    if "gemm" not in configs:  # compiled, not forced: autotuned per (P, C, K)
        grid = lambda meta: (triton.cdiv(tiles, meta["BLOCK_M"]), triton.cdiv(k, meta["BLOCK_N"]), 16)
        _winograd_gemm_autotuned[grid](v, u, m, tiles, c, k, **flags)
    else:
        cfg = configs["gemm"]
        grid = (triton.cdiv(tiles, cfg["BLOCK_M"]), triton.cdiv(k, cfg["BLOCK_N"]), 16)
        _winograd_gemm_kernel[grid](v, u, m, tiles, c, k, **flags, **_launch_opts(cfg))

    cfg = configs["output"]
    grid = (triton.cdiv(tiles, cfg["BLOCK_P"]), triton.cdiv(k, cfg["BLOCK_K"]))
    _winograd_output_kernel[grid](
        m, bias if bias is not None else m, out, h, w, k, th, tw, tiles, *out.stride(),
        HAS_BIAS=bias is not None, EMULATE_BF16=emulate_bf16, **_launch_opts(cfg),
    )  # fmt: skip
    return out
