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
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    shifted = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(shifted)) for b in range(256)]


def merge_chains(words) -> list[tuple[str, str]]:
    """Left-to-right merge chain of each word, in the given word order, without repeats."""
    merges: dict[tuple[str, str], None] = {}  # an ordered set
    for word in words:
        left, *rest = list(word[:-1]) + [word[-1] + "</w>"]
        for right in rest:
            merges[left, right] = None
            left += right
    return list(merges)


def _write(folder: str, name: str, text: str) -> None:
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        f.write(text)


def write_merges(folder: str, merges) -> None:
    """Write ``merges.txt``: one ``left right`` pair a line, the first merge ranked highest."""
    _write(folder, "merges.txt", "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


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
    alphabet = _byte_alphabet()
    merges = merge_chains(sorted({w.lower() for w in words if w}))
    # every byte, every byte ending a word, every merge's result, the special tokens (ids in that order)
    tokens = [*alphabet, *(ch + "</w>" for ch in alphabet), *(a + b for a, b in merges), *_SPECIAL]
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}

    config = {
        "model_max_length": model_max_length,
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "tokenizer_class": "CLIPTokenizer",
    }
    os.makedirs(save_dir, exist_ok=True)
    _write(save_dir, "vocab.json", json.dumps(vocab, ensure_ascii=False))
    write_merges(save_dir, merges)
    _write(save_dir, "tokenizer_config.json", json.dumps(config))
    # from_pretrained on a local folder works across transformers 4.x and 5.x,
    # whose CLIPTokenizer constructors differ.
    return CLIPTokenizer.from_pretrained(save_dir, local_files_only=True)
