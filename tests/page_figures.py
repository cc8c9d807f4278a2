"""A project page's figures read back from its HTML (core/page/render.py marks each with
``data-figure``, each table row with ``data-row``): what the page tests compare."""

from __future__ import annotations

from html.parser import HTMLParser

_VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "wbr",
}


class Figures(HTMLParser):
    """``figures``: the text of each element marked ``data-figure``, by name, in page
    order; ``rows``: table rows by their ``data-row``; ``text``: every text."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, list[str]] = {}
        self.rows: dict[str, int] = {}
        self.text: list[str] = []
        self._open: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        row = a.get("data-row")
        if tag == "tr" and row:
            self.rows[row] = self.rows.get(row, 0) + 1
        if tag not in _VOID:
            self._open.append((tag, a.get("data-figure")))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self._open.pop()

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == tag:
                del self._open[i:]
                return

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        figure = self._open[-1][1] if self._open else None
        if figure and data.strip():
            self.figures.setdefault(figure, []).append(data.strip())


def read_figures(html: str) -> Figures:
    parsed = Figures()
    parsed.feed(html)
    parsed.close()
    return parsed


def number(text: str) -> float:
    """A figure as the page groups it ("1,234") as a number."""
    return float(text.replace(",", ""))
