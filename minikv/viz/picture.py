"""A matplotlib figure that a notebook shows as a PNG, with a stable one-line text: nbval compares
every output's text but not its PNG, so the text says what the picture shows (docs/pictures.md)."""

import io

from matplotlib.figure import Figure

DPI = 100  # pixels per inch of every PNG; the figures are sized in inches for this


class Picture:
    """A figure plus the deterministic sentence that describes it; displays as a PNG."""

    def __init__(self, figure: Figure, text: str) -> None:
        self.figure, self.text = figure, text
        self._png: bytes | None = None

    def png(self) -> bytes:
        """The PNG, rendered once, when a front end first asks for it."""
        if self._png is None:
            buffer = io.BytesIO()
            self.figure.savefig(buffer, format="png", dpi=DPI)
            self._png = buffer.getvalue()
        return self._png

    def _repr_png_(self) -> bytes:
        return self.png()

    def __repr__(self) -> str:
        return self.text
