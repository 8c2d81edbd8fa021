"""A matplotlib figure that a notebook shows as a PNG, with a stable one-line text.

nbval compares every output's text but not its PNG, so a `Picture` carries a deterministic
sentence saying what it shows, and renders its PNG only when a front end asks (docs/pictures.md).
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure

DPI = 100  # pixels per inch of every PNG; the figures are sized in inches for this


def figure_png(figure: Figure, dpi: int = DPI) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


class Picture:
    """A figure plus the sentence that describes it; displays as a PNG."""

    def __init__(self, figure: Figure, text: str) -> None:
        self.figure, self.text = figure, text
        self._png: bytes | None = None

    def png(self) -> bytes:
        """The PNG, rendered once."""
        if self._png is None:
            self._png = figure_png(self.figure)
        return self._png

    def _repr_png_(self) -> bytes:
        return self.png()

    def __repr__(self) -> str:
        return self.text
