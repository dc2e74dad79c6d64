"""Image metrics: prompt-attribute accuracy for fastdiff-tiny's shapes domain, PSNR and SSIM."""

from fastdiff.metrics.attributes import Reading, checker_accuracy, colour_map, read_attributes, score
from fastdiff.metrics.fidelity import psnr, ssim

__all__ = ["Reading", "checker_accuracy", "colour_map", "psnr", "read_attributes", "score", "ssim"]
