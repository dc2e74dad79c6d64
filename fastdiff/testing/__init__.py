"""Offline building blocks for tests, notebooks and benchmarks.

Nothing here downloads anything: pipelines are random-weight and tokenizers
are built from a word list. Names load on first use, so importing one helper
does not load every pipeline class.
"""

from fastdiff import _lazy

_EXPORTS = {
    "ARCHS": "fastdiff.testing.pipelines",
    "tiny_pipeline": "fastdiff.testing.pipelines",
    "unet_probe_inputs": "fastdiff.testing.probe",
    "build_clip_tokenizer": "fastdiff.testing.tokenizer",
    "snapshot": "fastdiff.testing.snapshot",
    "differences": "fastdiff.testing.snapshot",
    "unet_output": "fastdiff.testing.snapshot",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = _lazy.attach(__name__, globals(), _EXPORTS)
