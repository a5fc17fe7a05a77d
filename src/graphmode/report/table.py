"""Tables as data: what a cell says and how it is marked, never HTML.

Every table of the report is a :class:`Table` of :class:`Cell` values; the page's Jinja templates
(``templates/_macros.html.j2``) render them with autoescaping on, so no text reaches the page unescaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cell:
    """One cell: ``text`` (bold when ``strong``), an optional colour ``swatch`` before it, and after it a
    superscript, a muted ``note`` and a red ``bad`` remark. ``cls``, ``title`` and ``style`` become the
    cell's attributes."""

    text: str = ""
    cls: str = ""
    title: str = ""
    strong: bool = False
    note: str = ""
    bad: str = ""
    swatch: str = ""
    sup: str = ""
    style: str = ""


def num(text: str, cls: str = "", title: str = "", strong: bool = False, style: str = "") -> Cell:
    """A right-aligned numeric cell."""
    return Cell(text, cls=f"num {cls}".strip(), title=title, strong=strong, style=style)


@dataclass
class Table:
    head: list[Cell]
    rows: list[list[Cell]]
    cls: str = ""
    caption: str = ""
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, head: Sequence[str | Cell], rows: Iterable[Sequence[str | Cell]], css: str = "",
           caption: str = "") -> Table:
        """A table from plain strings or cells."""
        def as_cell(c: str | Cell) -> Cell:
            return c if isinstance(c, Cell) else Cell(c)

        return cls([as_cell(h) for h in head], [[as_cell(c) for c in r] for r in rows], css, caption)

    def __bool__(self) -> bool:
        return bool(self.rows)
