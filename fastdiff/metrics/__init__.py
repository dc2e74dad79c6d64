"""Image metrics: prompt-attribute accuracy for fastdiff-tiny's shapes domain, PSNR and SSIM, texture."""

from fastdiff.metrics.attributes import Reading, checker_accuracy, colour_map, read_attributes, score
from fastdiff.metrics.fidelity import psnr, ssim
from fastdiff.metrics.texture import neighbour_difference

__all__ = [
    "Reading",
    "checker_accuracy",
    "colour_map",
    "neighbour_difference",
    "psnr",
    "read_attributes",
    "score",
    "ssim",
]
