"""Text that comes from data (a run directory's name, a label made from it) as each renderer must show it.

A path may hold any character but ``/`` and NUL: a pipe, a newline, markdown's or HTML's markup, a dollar sign.
Rendered as it is, a pipe adds a column to a markdown table, a newline splits its row, markup formats the rest of
the line, and a dollar sign starts matplotlib's mathematics (an odd count fails the plot after the work).
:func:`markdown_text` is what every markdown table and line of a report shows of such text, :func:`printable` what
a one-line sink (a W&B name, a label) shows; evaluation.plots turns matplotlib's mathematics off for every text it
draws.
"""

from __future__ import annotations

import re
import unicodedata

# Characters markdown gives a meaning anywhere in a line; "_" only where it opens or closes emphasis (at a word's
# edge): inside a word (p_rope) it is a letter, and left as it is. Brackets alone are text (a label's own tags,
# "[targets [512, 33280)]"): a link needs "](", whose "(" is escaped.
_MARKUP = re.compile(r"[\\|`*<>#~$]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])|(?<=\])\(")


def printable(text: str) -> str:
    """``text`` on one line: each control character (a newline, a tab, an escape) as its Python escape."""
    return "".join(
        character.encode("unicode_escape").decode("ascii") if unicodedata.category(character)[0] == "C" else character
        for character in str(text)
    )


def markdown_text(text: str) -> str:
    """``text`` as markdown shows it literally, on one line: markup characters escaped with a backslash."""
    return _MARKUP.sub(lambda found: "\\" + found.group(0), printable(text))
