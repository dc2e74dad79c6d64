"""A sweep's prompts: a list, a file (one prompt a line), fastdiff-tiny's prompt generator, or named groups
of those (summaries are given per group as well as overall)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class SpecError(ValueError):
    """A sweep spec that cannot run; the message names the key."""


@dataclass(frozen=True)
class Prompt:
    text: str
    group: str
    index: int  # position within its group


def _err(key: str, value, valid: str) -> SpecError:
    return SpecError(f"spec[{key!r}]: got {value!r}; {valid}")


def _prompt_source(src, key: str) -> list[str]:
    if isinstance(src, list):
        if not all(isinstance(p, str) and p.strip() for p in src):
            raise _err(key, src, "prompts must be non-empty strings")
        return list(src)
    if isinstance(src, dict) and "file" in src:
        path = Path(src["file"])
        if not path.is_file():
            raise _err(f"{key}.file", str(path), "file does not exist")
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if isinstance(src, dict) and "tiny" in src:
        from fastdiff.tiny import data as D

        split = src["tiny"]
        if split not in ("train", "heldout"):
            raise _err(f"{key}.tiny", split, "fastdiff-tiny splits are 'train' and 'heldout'")
        extra = sorted(set(src) - {"tiny", "n", "seed", "phrasing", "limit"})
        if extra:
            raise _err(f"{key}.{extra[0]}", src[extra[0]], "valid keys: tiny, n, seed, phrasing, limit")
        if "n" in src:
            prompts = [
                a.prompt
                for a in D.sample_attributes(int(src["n"]), seed=int(src.get("seed", 0)), split=split)
            ]
        else:
            prompts = [p for p, _ in D.list_prompts(split, phrasing=src.get("phrasing", "short"))]
        return prompts[: src.get("limit")]
    raise _err(key, src, "expected a list of prompts, {file = path}, {tiny = split, ...} or {groups = {...}}")


def prompts_of(data: dict) -> list[Prompt]:
    """The spec's prompts, each with its group and its index in the group."""
    src = data.get("prompts")
    if src is None:
        raise _err("prompts", None, "the sweep needs prompts")
    if isinstance(src, str):
        src = {"file": src}
    if isinstance(src, dict) and "groups" in src:
        groups = src["groups"]
        if not isinstance(groups, dict) or not groups:
            raise _err("prompts.groups", groups, "expected a non-empty table of prompt sources")
    else:
        groups = {"all": src}
    out = []
    for g, s in groups.items():
        texts = _prompt_source(s, f"prompts.groups.{g}" if len(groups) > 1 or g != "all" else "prompts")
        if not texts:
            raise _err(f"prompts.groups.{g}" if g != "all" else "prompts", s, "no prompts: the list is empty")
        out += [Prompt(t, str(g), i) for i, t in enumerate(texts)]
    return out


__all__ = ["Prompt", "SpecError", "prompts_of"]
