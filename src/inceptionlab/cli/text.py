"""Text in a terminal's columns: East Asian wide characters take two columns, combining marks none.

`str.ljust` and f-string widths count code points, so a table with class names such as 猫 or a
decomposed `café` (macOS file names) came out misaligned.
"""

from __future__ import annotations

import unicodedata


def display_width(text: str) -> int:
    """Columns `text` takes in a terminal (wcwidth's rule for the common cases, standard library only)."""
    width = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def pad(text: str, width: int) -> str:
    """`text` left-aligned in `width` terminal columns."""
    return text + " " * max(0, width - display_width(text))
