"""Drop-in modules: each subclasses the module it replaces and shares its parameters."""

from fastdiff.nn.attention import FastdiffAttnProcessor

__all__ = ["FastdiffAttnProcessor"]
