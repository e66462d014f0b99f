# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The table from a config's format name to its :class:`~nemo_ais.formats.base.Format`."""

from __future__ import annotations

from collections.abc import Mapping

from nemo_ais.formats.base import BF16, Format
from nemo_ais.formats.fp8_block import FP8_BLOCK
from nemo_ais.formats.mxfp4 import MXFP4
from nemo_ais.formats.mxfp8 import MXFP8
from nemo_ais.formats.nvfp4 import NVFP4_W4A4, NVFP4_W4A16

FORMATS: Mapping[str, Format] = {f.name: f for f in (BF16, FP8_BLOCK, MXFP8, NVFP4_W4A16, NVFP4_W4A4, MXFP4)}
"""Every format, by the name configs use (``rollout.format``, a refit's ``format``)."""

REFIT_FORMATS = tuple(name for name, f in FORMATS.items() if f.refit_pairs is not None)
"""The formats a refit stream can send to vLLM."""


def get_format(name: str) -> Format:
    """The record of format ``name`` (ValueError: unknown, listing the known ones)."""
    if name not in FORMATS:
        raise ValueError(f"format={name!r} is invalid: expected one of {sorted(FORMATS)}")
    return FORMATS[name]
