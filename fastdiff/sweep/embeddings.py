"""Prompt-embedding cache: each prompt's text-encoder output computed once per process.

Configurations and seeds of a sweep share prompts, and a pipeline call re-encodes its prompts every time.
The cache encodes each prompt once (batch 1, so the result does not depend on which other prompts share
a batch) and hands the pipelines their own ``prompt_embeds`` / ``negative_prompt_embeds`` (and SDXL's
``pooled_prompt_embeds`` / ``negative_pooled_prompt_embeds``) arguments.

Entries are keyed by a fingerprint of the text encoder(s) and tokenizer(s): a hash of every parameter's
name, dtype, shape and bytes and of the vocabulary. A LoRA loaded into the text encoder (new parameter
names), a fused LoRA or any in-place weight change (new bytes), or another model's encoder therefore never
reuses stale embeddings. The hash is memoised on each parameter's storage pointer and version counter,
which every in-place write increments, so it is computed once per encoder state, not per call.
"""

from __future__ import annotations

import hashlib
import time
from abc import ABC, abstractmethod

import torch


class PromptEncoder(ABC):
    """How a pipeline turns prompts into the embeddings its ``__call__`` accepts."""

    @abstractmethod
    def fingerprint(self) -> str:
        """Changes whenever the text encoder(s) or tokenizer(s) would encode differently."""

    @abstractmethod
    def encode(self, text: str) -> dict[str, torch.Tensor]:
        """The positive-prompt tensors of one prompt (batch 1), keyed as the pipeline's call keywords."""

    @abstractmethod
    def encode_negative(self, text: str | None) -> dict[str, torch.Tensor]:
        """The negative-prompt tensors (batch 1); ``None`` is the pipeline's own unconditional input."""

    def modules(self) -> list[torch.nn.Module]:
        """Text-encoder modules whose forward calls are counted."""
        return []


def _hash_modules(modules, tokenizers, memo: dict) -> str:
    state = []
    for m in modules:
        for name, p in m.state_dict(keep_vars=True).items():
            state.append((name, p.data_ptr(), p._version, tuple(p.shape), str(p.dtype)))
    key = (tuple(state), tuple(id(t) for t in tokenizers))
    if key in memo:
        return memo[key]
    h = hashlib.sha256()
    for m in modules:
        h.update(type(m).__qualname__.encode())
        for name, p in m.state_dict().items():
            t = p.detach().cpu().contiguous()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    for tok in tokenizers:
        h.update(type(tok).__qualname__.encode())
        vocab = sorted(tok.get_vocab().items())
        h.update(repr((vocab, getattr(tok, "model_max_length", None))).encode())
    memo.clear()  # one live state per encoder is all a sweep needs
    memo[key] = h.hexdigest()[:32]
    return memo[key]


class StableDiffusionEncoder(PromptEncoder):
    """diffusers' ``StableDiffusionPipeline.encode_prompt`` (CLIP, one encoder)."""

    def __init__(self, pipe):
        self.pipe = pipe
        self._memo: dict = {}

    def modules(self):
        return [self.pipe.text_encoder]

    def fingerprint(self) -> str:
        return _hash_modules([self.pipe.text_encoder], [self.pipe.tokenizer], self._memo)

    def _run(self, text: str) -> torch.Tensor:
        embeds, _ = self.pipe.encode_prompt(text, self.pipe._execution_device, 1, False)
        return embeds

    def encode(self, text):
        return {"prompt_embeds": self._run(text)}

    def encode_negative(self, text):
        # diffusers encodes a missing negative prompt as "" with the same tokenizer padding
        return {"negative_prompt_embeds": self._run(text or "")}


class StableDiffusionXLEncoder(PromptEncoder):
    """diffusers' ``StableDiffusionXLPipeline.encode_prompt`` (two encoders, pooled embeddings)."""

    def __init__(self, pipe):
        self.pipe = pipe
        self._memo: dict = {}

    def modules(self):
        return [m for m in (self.pipe.text_encoder, self.pipe.text_encoder_2) if m is not None]

    def fingerprint(self) -> str:
        toks = [t for t in (self.pipe.tokenizer, self.pipe.tokenizer_2) if t is not None]
        return _hash_modules(self.modules(), toks, self._memo)

    def _run(self, text: str):
        pe, _, pooled, _ = self.pipe.encode_prompt(
            text,
            device=self.pipe._execution_device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=False,
        )
        return pe, pooled

    def encode(self, text):
        pe, pooled = self._run(text)
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}

    def encode_negative(self, text):
        if text is None and self.pipe.config.force_zeros_for_empty_prompt:
            pe, pooled = self._zeros
            return {"negative_prompt_embeds": pe, "negative_pooled_prompt_embeds": pooled}
        pe, pooled = self._run(text or "")
        return {"negative_prompt_embeds": pe, "negative_pooled_prompt_embeds": pooled}

    @property
    def _zeros(self):
        pe, pooled = self._run("")  # shapes only; SDXL's unconditional input is zeros of these shapes
        return torch.zeros_like(pe), torch.zeros_like(pooled)


class EmbeddingCache:
    """Per-process cache of prompt embeddings, with counters of what it saved."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._entries: dict[tuple, dict[str, torch.Tensor]] = {}
        self.encoder_calls = 0  # forward calls of text-encoder modules
        self.encoded = 0  # prompts actually encoded
        self.hits = 0  # prompts served from the cache
        self.seconds = 0.0

    def _get(self, encoder: PromptEncoder, fp: str, kind: str, text) -> dict[str, torch.Tensor]:
        key = (fp, kind, text)
        if key in self._entries:
            self.hits += 1
            return self._entries[key]
        hooks = [m.register_forward_pre_hook(self._count) for m in encoder.modules()]
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                value = encoder.encode(text) if kind == "pos" else encoder.encode_negative(text)
        finally:
            for h in hooks:
                h.remove()
        self.seconds += time.perf_counter() - t0
        self.encoded += 1
        if self.enabled:
            self._entries[key] = value
        return value

    def _count(self, module, args):
        self.encoder_calls += 1

    def call_kwargs(
        self, encoder: PromptEncoder, prompts: list[str], negative: str | None, cfg: bool
    ) -> dict:
        """The embedding keywords for a batch of prompts (negative ones only when guidance is on)."""
        fp = encoder.fingerprint()
        rows = [self._get(encoder, fp, "pos", p) for p in prompts]
        out = {k: torch.cat([r[k] for r in rows]) for k in rows[0]}
        if cfg:
            neg = self._get(encoder, fp, "neg", negative)
            out.update({k: torch.cat([v] * len(prompts)) for k, v in neg.items()})
        return out

    def stats(self) -> dict:
        return {
            "embedding_cache": self.enabled,
            "text_encoder_calls": self.encoder_calls,
            "prompts_encoded": self.encoded,
            "cache_hits": self.hits,
            "encode_s": round(self.seconds, 4),
        }


__all__ = ["EmbeddingCache", "PromptEncoder", "StableDiffusionEncoder", "StableDiffusionXLEncoder"]
