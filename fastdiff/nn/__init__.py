"""Drop-in modules: each subclasses the module it replaces and shares its parameters."""

from fastdiff.nn.attention import FastdiffAttnProcessor
from fastdiff.nn.norm_act import FusedResnetBlock2D, GroupNormSiLU
from fastdiff.nn.winograd import WinogradConv2d

__all__ = ["FastdiffAttnProcessor", "FusedResnetBlock2D", "GroupNormSiLU", "WinogradConv2d"]
