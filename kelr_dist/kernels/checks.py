"""Argument checks shared by every layer: whole numbers that are not bools."""

from __future__ import annotations

from typing import Any

import numpy as np


def is_whole(value: Any, minimum: int = 0) -> bool:
    """Whether ``value`` is an integer (Python or numpy) ``>= minimum`` and not a bool.

    The one place where a bool is refused as an integer (``True`` is an ``int`` in Python);
    callers raise their own message naming the parameter.
    """
    return (
        not isinstance(value, bool)
        and isinstance(value, int | np.integer)
        and bool(value >= minimum)
    )
