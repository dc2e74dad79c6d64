"""Argument checks shared across fastdiff's packages: what counts as an int or a number, and the
"one of" and "count or None" checks.

Python counts ``True`` as an int, so every check that takes a count or a scale refuses bools explicitly.
Each message names the argument, what is valid and the value received (issue #16).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np


def is_int(value, numpy: bool = False) -> bool:
    """An int (``numpy=True``: numpy integers too); not a bool."""
    return isinstance(value, (int, np.integer) if numpy else int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or a float; not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_choice(name: str, value, valid: Collection) -> None:
    """``value`` must be one of ``valid``: else a ValueError naming the argument, the choices and the value."""
    if value not in valid:
        raise ValueError(f"{name} must be one of {list(valid)}, got {value!r}")


def check_count(name: str, value, meaning: str) -> None:
    """``value`` must be None or an int >= 1 (not a bool); ``meaning`` says what it counts and what None means."""
    if value is not None and not (is_int(value) and value >= 1):
        raise ValueError(f"{name} must be a positive int {meaning}, got {value!r}")
