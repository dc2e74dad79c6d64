"""A CLIP tokenizer built locally from a word list, so nothing is downloaded.

CLIP's tokenizer is byte-level BPE: a word is split into characters (the last
one suffixed with ``</w>``) and merged pair by pair following ``merges.txt``.
Adding, for each known word, the chain of left-to-right merges that rebuilds
it usually makes that word a single token; unknown words still tokenize into
characters, so any prompt is accepted. BPE applies the best-ranked merge
anywhere in a word, so one word's chain can split another ("p l" from "plain"
splits "purple"); `fastdiff.tiny.models.build_tokenizer` re-ranks the merges
where every word must stay whole. Random-weight test pipelines do not care.
"""

from __future__ import annotations

import json
import os
import tempfile

from transformers import CLIPTokenizer

_SPECIAL = ["<|startoftext|>", "<|endoftext|>"]


def _byte_alphabet() -> list[str]:
    """The printable stand-ins byte-level BPE uses for the 256 byte values.

    Printable Latin-1 bytes stand for themselves; the rest are shifted past 255
    so that no byte maps to whitespace or a control character.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, shift = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + shift)
            shift += 1
    return [out[b] for b in range(256)]


def build_clip_tokenizer(words=(), save_dir: str | None = None, model_max_length: int = 77) -> CLIPTokenizer:
    """Return a `CLIPTokenizer` whose vocabulary holds every byte plus `words` (see the module note).

    Args:
        words: lower-case words to make single tokens (e.g. a prompt grammar's vocabulary).
        save_dir: where to write vocab.json / merges.txt; if None, a temporary folder removed once the
            tokenizer is loaded (it holds its vocabulary in memory).
        model_max_length: padding length, 77 as in Stable Diffusion.
    """
    if save_dir is None:
        with tempfile.TemporaryDirectory(prefix="fastdiff-tok-") as tmp:
            return build_clip_tokenizer(words, tmp, model_max_length)
    vocab: dict[str, int] = {}

    def add(tok: str) -> None:
        if tok not in vocab:
            vocab[tok] = len(vocab)

    for ch in _byte_alphabet():
        add(ch)
    for ch in _byte_alphabet():
        add(ch + "</w>")
    merges: list[tuple[str, str]] = []
    seen = set()
    for word in sorted({w.lower() for w in words if w}):
        symbols = list(word[:-1]) + [word[-1] + "</w>"]
        left = symbols[0]
        for right in symbols[1:]:
            pair = (left, right)
            if pair not in seen:
                seen.add(pair)
                merges.append(pair)
            left = left + right
            add(left)
        add(left)
    for tok in _SPECIAL:
        add(tok)

    os.makedirs(save_dir, exist_ok=True)
    vocab_file = os.path.join(save_dir, "vocab.json")
    merges_file = os.path.join(save_dir, "merges.txt")
    with open(vocab_file, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(merges_file, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    with open(os.path.join(save_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "model_max_length": model_max_length,
                "bos_token": "<|startoftext|>",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "tokenizer_class": "CLIPTokenizer",
            },
            f,
        )
    # from_pretrained on a local folder works across transformers 4.x and 5.x,
    # whose CLIPTokenizer constructors differ.
    return CLIPTokenizer.from_pretrained(save_dir, local_files_only=True)
