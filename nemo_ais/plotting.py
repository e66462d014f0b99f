# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The shared look of the PNG plots of ``nemo-ais report`` and ``nemo-ais analyze``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
COLORS = tuple(f"C{i}" for i in range(10))
_MARKS_PER_LINE = 12


def series_style(index: int, num_points: int) -> dict[str, Any]:
    """``plot()`` keywords of series ``index``: colour, marker, line style, marker spacing.

    Every series has its own colour, marker and line style; (marker, line style) pairs are distinct for the first
    ``8 * 4`` series. Markers are hollow, thinned to about 12 per line and shifted by the index, so where series
    coincide (two arms that train identically) each one's marker still shows (nested outlines, or side by side).
    """
    every = max(1, num_points // _MARKS_PER_LINE)
    return {
        "color": COLORS[index % len(COLORS)],
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": LINESTYLES[(index + index // len(MARKERS)) % len(LINESTYLES)],
        "markevery": (index % every, every),
        "markersize": 8 - 1.2 * (index % len(LINESTYLES)),  # nested where they coincide
        "markerfacecolor": "none",  # hollow: coinciding markers of two series both show
        "markeredgewidth": 1.2,
        "linewidth": 1.3,
    }


def style_axes(ax, *, ylabel: str, xlabel: str = "GRPO step", title: str | None = None, steps: bool = True) -> None:
    """Axis labels, a light grid and (``steps``: x is a step count) integer x ticks."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, fontsize=10)
    if steps:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figures(figures: dict[str, Any], out_dir: Path, dpi: int) -> list[Path]:
    """Save each ``{file name: figure}`` under ``out_dir`` and close it; the paths written.

    Each file is written beside its path and renamed into place: an interrupted save leaves the old file or none.
    """
    plt, written = pyplot(), []
    for name, fig in figures.items():
        written.append(Path(out_dir) / name)
        partial = written[-1].with_name(name + ".partial")
        try:
            fig.savefig(partial, dpi=dpi, format=written[-1].suffix.lstrip(".") or None)
            os.replace(partial, written[-1])
        finally:
            partial.unlink(missing_ok=True)
            plt.close(fig)
    return written
