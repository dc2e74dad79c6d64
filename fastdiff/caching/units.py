"""The skip-connection view of a diffusers ``UNet2DConditionModel`` that the step cache works on.

A U-Net is a chain of *producers* on the way down, each of which leaves one skip tensor behind
(``conv_in``; every resnet(+transformer) layer of a down block; every downsampler), the mid block, and a
chain of *consumers* on the way up, each of which concatenates one skip tensor (popped from the end) and
runs a resnet(+transformer) layer; upsamplers sit between up blocks. Producer ``j`` and the consumer that
pops skip ``j`` are partners (DeepCache, Ma et al. 2024, Sec. 3.2: "skip branch" ``j``).

Caching at branch ``k`` keeps producers ``0..k`` and every up-path unit from the partner of skip ``k``
onwards fresh, and replays everything in between (producers ``k+1..``, the mid block and the up-path units
before the partner of ``k``) from the last full step. Only the last replayed up-path unit's output reaches
a fresh unit; the other replayed outputs are there so that the U-Net's own forward runs unchanged.

Units are the U-Net's own submodules (resnets, ``Transformer2DModel`` layers, down/upsamplers, mid block);
this module only names them. It reads the block attributes diffusers' blocks define (``resnets``,
``attentions``, ``downsamplers``, ``upsamplers``) and refuses U-Nets whose blocks lack ``resnets``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Unit:
    """One submodule the cache may replay."""

    name: str  # dotted path inside the U-Net, e.g. "down_blocks.0.resnets.1"
    module: nn.Module
    side: str  # "down", "mid" or "up"
    order: int  # execution order on its side (down: skip index; up: position in the up path)


@dataclass(frozen=True)
class UNetLayout:
    """Producers (one per skip), the mid block, and the up path in execution order."""

    producers: tuple[tuple[Unit, ...], ...]  # producers[j]: modules that make skip j (resnet, attention)
    mid: Unit | None
    up_path: tuple[tuple[Unit, ...], ...]  # groups in execution order: a consumer layer or an upsampler
    partner: tuple[int, ...]  # partner[j] = index into up_path of the consumer of skip j

    @property
    def num_branches(self) -> int:
        """Valid branches are 0 .. num_branches - 1 (the deepest skip cannot be cached around)."""
        return len(self.producers) - 1

    def replayed(self, branch: int) -> list[Unit]:
        """Units a cached step replays at ``branch`` (everything between producer ``branch`` and its partner)."""
        if not 0 <= branch < self.num_branches:
            raise ValueError(f"branch must be in [0, {self.num_branches - 1}] for this U-Net, got {branch!r}")
        units = [u for group in self.producers[branch + 1 :] for u in group]
        if self.mid is not None:
            units.append(self.mid)
        units += [u for group in self.up_path[: self.partner[branch]] for u in group]
        return units

    def entry(self, branch: int) -> Unit:
        """The last replayed up-path unit: its output is the cached feature a fresh unit reads."""
        return self.up_path[self.partner[branch] - 1][-1]

    def probe(self, branch: int) -> Unit:
        """The deepest fresh producer: its output is the adaptive mode's change signal."""
        return self.producers[branch][-1]


def _layer_units(prefix: str, block: nn.Module, i: int, side: str, order: int) -> tuple[Unit, ...]:
    units = [Unit(f"{prefix}.resnets.{i}", block.resnets[i], side, order)]
    attentions = getattr(block, "attentions", None)  # DownBlock2D / UpBlock2D have none
    if attentions is not None:
        units.append(Unit(f"{prefix}.attentions.{i}", attentions[i], side, order))
    return tuple(units)


def layout(unet: nn.Module) -> UNetLayout:
    """Name the producers, mid block and up path of a ``UNet2DConditionModel``-like U-Net."""
    for kind in ("down_blocks", "up_blocks"):
        for i, block in enumerate(getattr(unet, kind, None) or ()):
            if not isinstance(getattr(block, "resnets", None), nn.ModuleList):
                raise NotImplementedError(
                    f"step_cache: {kind}[{i}] ({type(block).__name__}) has no `resnets`; only diffusers "
                    "UNet2DConditionModel-style blocks are supported"
                )
    if not hasattr(unet, "down_blocks") or not hasattr(unet, "conv_in"):
        raise TypeError(f"step_cache needs a diffusers UNet2DConditionModel, got {type(unet).__name__}")

    producers: list[tuple[Unit, ...]] = [(Unit("conv_in", unet.conv_in, "down", 0),)]
    for b, block in enumerate(unet.down_blocks):
        for i in range(len(block.resnets)):
            producers.append(_layer_units(f"down_blocks.{b}", block, i, "down", len(producers)))
        for d, down in enumerate(block.downsamplers or ()):
            producers.append((Unit(f"down_blocks.{b}.downsamplers.{d}", down, "down", len(producers)),))

    mid = Unit("mid_block", unet.mid_block, "mid", 0) if unet.mid_block is not None else None

    up_path: list[tuple[Unit, ...]] = []
    consumers: list[int] = []  # up_path index of each consumer, in pop order (deepest skip first)
    for b, block in enumerate(unet.up_blocks):
        for i in range(len(block.resnets)):
            consumers.append(len(up_path))
            up_path.append(_layer_units(f"up_blocks.{b}", block, i, "up", len(up_path)))
        for u, up in enumerate(block.upsamplers or ()):
            up_path.append((Unit(f"up_blocks.{b}.upsamplers.{u}", up, "up", len(up_path)),))

    if len(consumers) != len(producers):
        raise NotImplementedError(
            f"step_cache: {len(producers)} skip tensors are produced but {len(consumers)} consumed; "
            "this U-Net layout is not supported"
        )
    # Consumers pop skips from the end: the first consumer takes the deepest skip.
    partner = tuple(reversed(consumers))
    return UNetLayout(tuple(producers), mid, tuple(up_path), partner)


def cross_attentions(unet: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every cross-attention (``attn2`` of a transformer block) in the U-Net, by name."""
    out = []
    for name, module in unet.named_modules():
        attn2 = getattr(module, "attn2", None)  # BasicTransformerBlock; None when it has no cross-attention
        if isinstance(attn2, nn.Module) and getattr(module, "only_cross_attention", False) is False:
            out.append((f"{name}.attn2", attn2))
    return out
