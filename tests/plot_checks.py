# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""What a publishable plot of ``nemo-ais report`` / ``nemo-ais analyze`` has, as a check.

``from plot_checks import assert_publishable`` (``tests/`` is on ``sys.path``, as for
``shipped_configs``). It inspects the matplotlib objects, not the pixels.
"""

from __future__ import annotations


def assert_publishable(fig, series: set[str]) -> None:
    """Checks every plot panel of ``fig`` as a reader of a paper would.

    A y label (with its unit), integer ticks on a step axis, one (marker, line style) per
    series so that coinciding series stay visible, and a legend naming every series.
    """
    fig.canvas.draw()  # tick locations are computed at draw time
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    named = {t.get_text() for legend in legends for t in legend.get_texts()}
    assert series <= named, f"legends name {named}, expected every series of {series}"
    for ax in fig.axes:
        lines = [x for x in ax.get_lines() if not x.get_label().startswith("_")]
        if not lines and not ax.collections:
            continue
        assert ax.get_ylabel().strip(), f"panel {ax.get_title()!r} has no y label"
        if "step" in ax.get_xlabel():
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)
        styles = [(x.get_marker(), x.get_linestyle()) for x in lines]
        assert len(set(styles)) == len(styles), (ax.get_title(), styles)
        assert all(m not in (None, "None", "", " ") for m, _ in styles), ax.get_title()
