"""GroupNorm (+SiLU) with fp32 statistics: Triton kernels, launchers and the PyTorch reference.

GroupNorm (Wu & He 2018, eq. 1-2) normalises each (sample, group) over its C/G channels and all pixels:

    y = (x - mean_ng) / sqrt(var_ng + eps) * gamma_c + beta_c,        then SiLU(y) = y * sigmoid(y).

Per (n, c) this is an affine map ``y = x * scale[n, c] + shift[n, c]`` with ``scale = rstd * gamma`` and
``shift = beta - mean * rstd * gamma``, so the work splits into

1. statistics: count/mean/M2 per (n, g) in fp32, combined across blocks and programs with Chan's parallel
   update (numerically stable, unlike sum/sum-of-squares);
2. apply: one element-wise pass ``silu(x * scale + shift)``.

Small groups (the 16x16 and 8x8 U-Net levels) take a one-pass kernel instead: one program holds the whole
group in registers, computes the statistics and writes the activation, so ``x`` is read once.
Both NCHW-contiguous and channels_last inputs are read in place (other layouts are made contiguous first);
the output keeps the input's memory format.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._triton_compat import HAS_TRITON, check_triton_device, tl, triton, triton_interpret

if HAS_TRITON:
    from ._triton_compat import round_bf16_rne

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# one-pass kernel when the padded group fits in this many registers-worth of elements
ONE_PASS_MAX_ELEMENTS = 8192


def group_norm_silu_reference(x, num_groups, weight=None, bias=None, eps=1e-5, apply_silu=True):
    """Plain PyTorch: what diffusers runs (``F.group_norm`` then ``F.silu``) in the input dtype."""
    y = F.group_norm(x, num_groups, weight, bias, eps)
    return F.silu(y) if apply_silu else y


def check_group_norm_inputs(x, num_groups, weight, bias) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (N, C, H, W), got shape {tuple(x.shape)}")
    if not isinstance(num_groups, int) or num_groups <= 0:
        raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
    c = x.shape[1]
    if c % num_groups:
        raise ValueError(f"channels ({c}) must be divisible by num_groups ({num_groups})")
    if x.numel() and (c // num_groups) * x.shape[2] * x.shape[3] < 2:
        raise ValueError(
            f"GroupNorm needs more than one value per group; got {c // num_groups} channel(s) per group "
            f"of a {x.shape[2]}x{x.shape[3]} image"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            if p.shape != (c,):
                raise ValueError(f"GroupNorm {name} must have shape ({c},), got {tuple(p.shape)}")
            if p.device != x.device:
                raise ValueError(f"GroupNorm {name} is on {p.device} but x is on {x.device}")


def _layout(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Return (x, channels_last) with x either NCHW-contiguous or channels_last-contiguous."""
    if x.is_contiguous():
        return x, False
    if x.is_contiguous(memory_format=torch.channels_last):
        return x, True
    return x.contiguous(), False


if HAS_TRITON:

    @triton.jit
    def _sample_and_group(ng, C, CG):
        """(n, g) of program ``ng``, which handles group g of sample n (C // CG groups per sample)."""
        G = C // CG
        return ng // G, ng % G

    @triton.jit
    def _gn_stats_kernel(
        x_ptr, part_ptr,
        C, HW, CG, HW_PER_SPLIT, SPLIT,
        sxn, sxc, sxhw,
        BLOCK_HW: tl.constexpr, BLOCK_CG: tl.constexpr,
    ):  # fmt: skip
        """Partial (count, mean, M2) of one (n, g) over one slice of pixels."""
        ng = tl.program_id(0)
        s = tl.program_id(1)
        n, g = _sample_and_group(ng, C, CG)
        base = x_ptr + n.to(tl.int64) * sxn + (g * CG).to(tl.int64) * sxc
        hw_start = s * HW_PER_SPLIT
        hw_end = tl.minimum(hw_start + HW_PER_SPLIT, HW)
        count = 0.0
        mean = 0.0
        m2 = 0.0
        for hw0 in range(hw_start, hw_end, BLOCK_HW):
            hw = hw0 + tl.arange(0, BLOCK_HW)
            hw_mask = hw < hw_end
            for c0 in range(0, CG, BLOCK_CG):
                cc = c0 + tl.arange(0, BLOCK_CG)
                mask = hw_mask[:, None] & (cc < CG)[None, :]
                ptrs = base + (hw.to(tl.int64) * sxhw)[:, None] + (cc.to(tl.int64) * sxc)[None, :]
                v = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
                # Chan et al.: merge this block's (count, mean, M2) into the running triple
                b_count = tl.sum(mask.to(tl.float32), axis=None)
                b_mean = tl.sum(v, axis=None) / tl.maximum(b_count, 1.0)
                dev = tl.where(mask, v - b_mean, 0.0)
                b_m2 = tl.sum(dev * dev, axis=None)
                total = count + b_count
                delta = b_mean - mean
                frac = b_count / tl.maximum(total, 1.0)
                mean = mean + delta * frac
                m2 = m2 + b_m2 + delta * delta * count * frac
                count = total
        out = part_ptr + (ng * SPLIT + s) * 3
        tl.store(out + 0, count)
        tl.store(out + 1, mean)
        tl.store(out + 2, m2)

    @triton.jit
    def _gn_finalize_kernel(
        part_ptr, gamma_ptr, beta_ptr, escale_ptr, eshift_ptr, scale_ptr, shift_ptr,
        C, CG, SPLIT, eps,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_EXTRA: tl.constexpr,
        BLOCK_S: tl.constexpr, BLOCK_CG: tl.constexpr,
    ):  # fmt: skip
        """Combine the partials of one (n, g) and write per-channel scale/shift for its channels."""
        ng = tl.program_id(0)
        n, g = _sample_and_group(ng, C, CG)
        s = tl.arange(0, BLOCK_S)
        s_mask = s < SPLIT
        p = part_ptr + (ng * SPLIT + s) * 3
        cnt = tl.load(p + 0, mask=s_mask, other=0.0)
        mu = tl.load(p + 1, mask=s_mask, other=0.0)
        m2 = tl.load(p + 2, mask=s_mask, other=0.0)
        total = tl.sum(cnt, axis=0)
        mean = tl.sum(cnt * mu, axis=0) / total
        d = mu - mean
        var = tl.sum(m2 + cnt * d * d, axis=0) / total
        rstd = 1.0 / tl.sqrt(var + eps)
        for c0 in range(0, CG, BLOCK_CG):
            cc = c0 + tl.arange(0, BLOCK_CG)
            c_mask = cc < CG
            c = g * CG + cc
            a = tl.zeros([BLOCK_CG], dtype=tl.float32) + rstd
            if HAS_WEIGHT:
                a = a * tl.load(gamma_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
            b = -mean * a
            if HAS_BIAS:
                b = b + tl.load(beta_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
            if HAS_EXTRA:  # y * (1 + es) + et, folded into the same affine map
                es = tl.load(escale_ptr + n * C + c, mask=c_mask, other=0.0).to(tl.float32) + 1.0
                et = tl.load(eshift_ptr + n * C + c, mask=c_mask, other=0.0).to(tl.float32)
                a = a * es
                b = b * es + et
            tl.store(scale_ptr + n * C + c, a, mask=c_mask)
            tl.store(shift_ptr + n * C + c, b, mask=c_mask)

    @triton.jit
    def _affine_silu_kernel(
        x_ptr, y_ptr, scale_ptr, shift_ptr, C, HW, TOTAL,
        CHANNELS_LAST: tl.constexpr, APPLY_SILU: tl.constexpr, EMULATE_BF16: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """y = silu(x * scale[n, c] + shift[n, c]) over contiguous (NCHW or NHWC) memory."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < TOTAL
        if CHANNELS_LAST:
            c = offs % C
            n = offs // (HW * C)
        else:
            c = (offs // HW) % C
            n = offs // (HW * C)
        nc = n * C + c
        v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = v * tl.load(scale_ptr + nc, mask=mask, other=0.0) + tl.load(shift_ptr + nc, mask=mask, other=0.0)
        if APPLY_SILU:
            v = v * tl.sigmoid(v)
        if EMULATE_BF16:
            v = round_bf16_rne(v)
        tl.store(y_ptr + offs, v.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _gn_silu_one_pass_kernel(
        x_ptr, y_ptr, gamma_ptr, beta_ptr,
        C, HW, CG, eps,
        sxn, sxc, sxhw,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, APPLY_SILU: tl.constexpr, EMULATE_BF16: tl.constexpr,
        BLOCK_HW: tl.constexpr, BLOCK_CG: tl.constexpr,
    ):  # fmt: skip
        """Whole (n, g) group in registers: exact two-pass statistics, then normalise + SiLU, one read."""
        ng = tl.program_id(0)
        n, g = _sample_and_group(ng, C, CG)
        hw = tl.arange(0, BLOCK_HW)
        cc = tl.arange(0, BLOCK_CG)
        mask = (hw < HW)[:, None] & (cc < CG)[None, :]
        offs = (
            n.to(tl.int64) * sxn
            + ((g * CG + cc).to(tl.int64) * sxc)[None, :]
            + (hw.to(tl.int64) * sxhw)[:, None]
        )
        v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        count = HW * CG * 1.0
        mean = tl.sum(v, axis=None) / count
        dev = tl.where(mask, v - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(dev * dev, axis=None) / count + eps)
        y = dev * rstd
        c = g * CG + cc
        if HAS_WEIGHT:
            y = y * tl.load(gamma_ptr + c, mask=cc < CG, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            y = y + tl.load(beta_ptr + c, mask=cc < CG, other=0.0).to(tl.float32)[None, :]
        if APPLY_SILU:
            y = y * tl.sigmoid(y)
        if EMULATE_BF16:
            y = round_bf16_rne(y)
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _num_splits(n_groups_total: int, hw: int, block_hw: int, device: torch.device) -> int:
    """Programs per (n, g) for the statistics pass: enough to fill a GPU, at most two off CUDA."""
    blocks = triton.cdiv(hw, block_hw)
    if device.type != "cuda":
        return min(2, blocks)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(blocks, triton.cdiv(4 * sms, n_groups_total)))


def group_norm_scale_shift_triton(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    extra_scale: torch.Tensor | None = None,
    extra_shift: torch.Tensor | None = None,
    splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 per-(n, c) ``scale``, ``shift`` with ``GroupNorm(x) == x * scale + shift``.

    ``extra_scale``/``extra_shift`` (N, C) fold a following ``y * (1 + extra_scale) + extra_shift``
    (diffusers' "scale_shift" time-embedding norm) into the same map.
    """
    check_group_norm_inputs(x, num_groups, weight, bias)
    check_triton_device(x, weight, bias)
    x, _ = _layout(x)
    n, c, h, w = x.shape
    hw, cg = h * w, c // num_groups
    block_cg = min(triton.next_power_of_2(cg), 64)
    block_hw = max(16, min(triton.next_power_of_2(hw), 4096 // block_cg))
    split = splits or _num_splits(n * num_groups, hw, block_hw, x.device)
    hw_per_split = triton.cdiv(triton.cdiv(hw, split), block_hw) * block_hw
    split = triton.cdiv(hw, hw_per_split)
    part = torch.empty((n * num_groups, split, 3), device=x.device, dtype=torch.float32)
    _gn_stats_kernel[(n * num_groups, split)](
        x, part, c, hw, cg, hw_per_split, split, x.stride(0), x.stride(1), x.stride(3),
        BLOCK_HW=block_hw, BLOCK_CG=block_cg,
    )  # fmt: skip
    scale = torch.empty((n, c), device=x.device, dtype=torch.float32)
    shift = torch.empty_like(scale)
    has_extra = extra_scale is not None
    if has_extra:
        if extra_shift is None or tuple(extra_scale.shape) != (n, c) or tuple(extra_shift.shape) != (n, c):
            raise ValueError(f"extra_scale and extra_shift must both have shape ({n}, {c})")
        extra_scale, extra_shift = extra_scale.contiguous(), extra_shift.contiguous()
    dummy = part
    _gn_finalize_kernel[(n * num_groups,)](
        part, weight if weight is not None else dummy, bias if bias is not None else dummy,
        extra_scale if has_extra else dummy, extra_shift if has_extra else dummy, scale, shift,
        c, cg, split, float(eps),
        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, HAS_EXTRA=has_extra,
        BLOCK_S=max(2, triton.next_power_of_2(split)), BLOCK_CG=block_cg,
    )  # fmt: skip
    return scale, shift


def affine_silu_triton(x, scale, shift, apply_silu=True, out=None):
    """``silu(x * scale[n, c] + shift[n, c])`` in x's memory format (NCHW or channels_last)."""
    x, channels_last = _layout(x)
    n, c, h, w = x.shape
    if out is None:
        out = torch.empty_like(x)  # preserves the memory format of a dense tensor
    block = 1024
    total = x.numel()
    _affine_silu_kernel[(triton.cdiv(total, block),)](
        x, out, scale, shift, c, h * w, total,
        CHANNELS_LAST=channels_last, APPLY_SILU=apply_silu, BLOCK=block,
        EMULATE_BF16=out.dtype == torch.bfloat16 and triton_interpret(), num_warps=4,
    )  # fmt: skip
    return out


def group_norm_silu_triton(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    apply_silu: bool = True,
    one_pass: bool | None = None,
    splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """GroupNorm (+SiLU) with Triton. ``one_pass=None`` picks the single-read kernel for small groups.

    ``out`` (optional) must be a dense tensor with x's shape, dtype and memory format."""
    check_group_norm_inputs(x, num_groups, weight, bias)
    check_triton_device(x, weight, bias)
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"GroupNorm Triton kernels support {SUPPORTED_DTYPES}, got {x.dtype}")
    x, _ = _layout(x)
    n, c, h, w = x.shape
    hw, cg = h * w, c // num_groups
    block_hw, block_cg = triton.next_power_of_2(hw), triton.next_power_of_2(cg)
    if one_pass is None:
        one_pass = block_hw * block_cg <= ONE_PASS_MAX_ELEMENTS
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.stride() != x.stride():
        raise ValueError("out must match x in shape, dtype and memory format")
    if one_pass:
        warps = 1 if triton_interpret() else min(16, max(1, block_hw * block_cg // 512))
        _gn_silu_one_pass_kernel[(n * num_groups,)](
            x, out, weight if weight is not None else x, bias if bias is not None else x,
            c, hw, cg, float(eps), x.stride(0), x.stride(1), x.stride(3),
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, APPLY_SILU=apply_silu,
            EMULATE_BF16=x.dtype == torch.bfloat16 and triton_interpret(),
            BLOCK_HW=block_hw, BLOCK_CG=block_cg, num_warps=warps,
        )  # fmt: skip
        return out
    scale, shift = group_norm_scale_shift_triton(x, num_groups, weight, bias, eps, splits=splits)
    return affine_silu_triton(x, scale, shift, apply_silu=apply_silu, out=out)
