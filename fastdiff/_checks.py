"""What counts as an int or a number in fastdiff's argument checks: one rule for every package.

Python counts ``True`` as an int, so every check that takes a count or a scale refuses bools explicitly;
each caller keeps its own message naming the argument and what is valid (issue #16).
"""

from __future__ import annotations

import numpy as np


def is_int(value, numpy: bool = False) -> bool:
    """An int (``numpy=True``: numpy integers too); not a bool."""
    return isinstance(value, (int, np.integer) if numpy else int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or a float; not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
