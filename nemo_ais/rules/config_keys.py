# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Dotted-key lookup in a nested config mapping (a NeMo-RL YAML as dicts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def get(cfg: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """``cfg["a"]["b"]`` for ``"a.b"``; ``default`` if a part is absent or null."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return default
        node = node[part]
    return node


def has(cfg: Mapping[str, Any], dotted: str) -> bool:
    """True if every part of ``dotted`` is present (a null value counts as present)."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def section_enabled(section: Any) -> bool:
    """A section (a mapping) that is on: ``enabled`` true or absent, as the refit sections' models default it."""
    return isinstance(section, Mapping) and section.get("enabled", True) is True
