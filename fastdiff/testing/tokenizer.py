"""A CLIP tokenizer built locally from a word list, so nothing is downloaded.

CLIP's tokenizer is byte-level BPE: a word is split into characters (the last
one suffixed with ``</w>``) and merged pair by pair following ``merges.txt``.
Adding, for each known word, the chain of left-to-right merges that rebuilds
it usually makes that word a single token; unknown words still tokenize into
characters, so any prompt is accepted. BPE applies the best-ranked merge
anywhere in a word, so one word's chain can split another ("p l" from "plain"
splits "purple"); ``whole_words=True`` re-ranks the merges where every word
must stay whole (fastdiff-tiny's tokenizer). Random-weight test pipelines do not care.
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


def _merge_chains(words) -> list[tuple[str, str]]:
    """Left-to-right merge chain of each word, in the given word order, without repeats."""
    merges: dict[tuple[str, str], None] = {}  # an ordered set
    for word in words:
        left, *rest = list(word[:-1]) + [word[-1] + "</w>"]
        for right in rest:
            merges[left, right] = None
            left += right
    return list(merges)


def _bpe_pieces(word: str, ranks: dict) -> int:
    """Number of tokens byte-pair encoding with merge `ranks` leaves `word` in."""
    symbols = list(word[:-1]) + [word[-1] + "</w>"]
    while len(symbols) > 1:
        pairs = [(ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))]
        rank, i = min(pairs)
        if rank == 1 << 30:
            break
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    return len(symbols)


def _whole_word_merges(words: list[str]) -> list[tuple[str, str]]:
    """The merge chains of `words` ranked so that BPE leaves every word one token.

    Found by moving the words that split to the front until none does.
    """
    for _ in range(100):
        merges = _merge_chains(words)
        ranks = {m: r for r, m in enumerate(merges)}
        split = [w for w in words if _bpe_pieces(w, ranks) != 1]
        if not split:
            return merges
        words = split + [w for w in words if w not in split]
    raise RuntimeError(f"no merge order keeps {split} whole")


def _write(folder: str, name: str, text: str) -> None:
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        f.write(text)


def build_clip_tokenizer(
    words=(), save_dir: str | None = None, model_max_length: int = 77, whole_words: bool = False
) -> CLIPTokenizer:
    """Return a `CLIPTokenizer` whose vocabulary holds every byte plus `words` (see the module note).

    Args:
        words: lower-case words to make single tokens (e.g. a prompt grammar's vocabulary).
        save_dir: where to write vocab.json / merges.txt; if None, a temporary folder removed once the
            tokenizer is loaded (it holds its vocabulary in memory).
        model_max_length: padding length, 77 as in Stable Diffusion.
        whole_words: rank the same merges (same vocabulary) so that no word's merges split another
            (see the module note); RuntimeError if no ranking does.
    """
    if save_dir is None:
        with tempfile.TemporaryDirectory(prefix="fastdiff-tok-") as tmp:
            return build_clip_tokenizer(words, tmp, model_max_length, whole_words)
    alphabet = _byte_alphabet()
    words = sorted({w.lower() for w in words if w})
    merges = _merge_chains(words)
    # every byte, every byte ending a word, every merge's result, the special tokens (ids in that order)
    tokens = [*alphabet, *(ch + "</w>" for ch in alphabet), *(a + b for a, b in merges), *_SPECIAL]
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}
    if whole_words:
        merges = _whole_word_merges(words)

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
    _write(save_dir, "merges.txt", "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    _write(save_dir, "tokenizer_config.json", json.dumps(config))
    # from_pretrained on a local folder works across transformers 4.x and 5.x,
    # whose CLIPTokenizer constructors differ.
    return CLIPTokenizer.from_pretrained(save_dir, local_files_only=True)
