"""Text for messages: a few examples of a long list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def few(items: Sequence[Any], limit: int = 5) -> str:
    """The first `limit` items as their reprs, comma-separated, with ", ..." when there are more.

    Args:
        items: What to show a few of (image ids, keys).
        limit: How many to show.
    """
    return ", ".join(repr(item) for item in items[:limit]) + (", ..." if len(items) > limit else "")


__all__ = ["few"]
