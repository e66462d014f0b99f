# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Load a NeMo-RL GRPO config the way NeMo-RL's entry point does, and read dotted keys.

:func:`load_config` IS NeMo-RL's loader (``nemo_rl.utils.config``) when NeMo-RL is
importable, else :func:`load_config_fallback`, a re-implementation (omegaconf and pyyaml
only) that ``tests/adapters/test_master_config.py`` proves equal on every shipped config.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from nemo_ais.rules.config_keys import get as get, has


def is_mixin(cfg: Mapping[str, Any]) -> bool:
    """True for an arm mixin: a ``loss_fn.ais`` delta without ``policy``/``cluster``.

    Anything else is checked as a full config (a YAML without the sections fails).
    """
    return has(cfg, "loss_fn.ais") and ("policy" not in cfg or "cluster" not in cfg)


def nemo_rl_loader() -> ModuleType | None:
    """``nemo_rl.utils.config`` (NeMo-RL's loader: omegaconf + hydra), or None if absent."""
    try:
        import nemo_rl.utils.config as nemo_rl_config
    except ImportError:
        return None
    return nemo_rl_config


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load a config exactly as NeMo-RL's entry point does, apply overrides, resolve.

    Returns a plain, interpolated dict (no ``defaults`` key).
    """
    upstream = nemo_rl_loader()
    if upstream is None:
        return load_config_fallback(path, overrides)
    upstream.register_omegaconf_resolvers()
    if not Path(path).is_file():
        raise FileNotFoundError(f"config {path} does not exist")
    try:
        cfg = upstream.load_config(str(path))
    except yaml.YAMLError as err:  # the file (or a defaults: parent) named in the message
        raise _malformed(err) from None
    if overrides:
        try:
            cfg = upstream.parse_hydra_overrides(cfg, list(overrides))
        except upstream.OverridesError as err:
            raise ValueError(str(err)) from err
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return data


def _register_resolvers() -> None:
    # Same names and meaning as NeMo-RL's resolvers (main's: v0.7.0 lacks add), so its YAML
    # interpolations resolve here.
    for name, fn in (
        ("add", lambda a, b: a + b),
        ("mul", lambda a, b: a * b),
        ("div", lambda a, b: a / b),
        ("max", lambda a, b: max(a, b)),
    ):
        if not OmegaConf.has_resolver(name):
            with warnings.catch_warnings():  # omegaconf 2.4 renamed it; 2.3 (NeMo-RL) has only this
                warnings.simplefilter("ignore")
                OmegaConf.register_new_resolver(name, fn)


def _merge(base: DictConfig, child: DictConfig) -> DictConfig:
    #  A section marked `_override_: true` replaces the inherited one instead of merging. A mandatory value (`???`)
    #  stays for a child or an override to set (NeMo-RL main; v0.7.0 raised).
    for key in list(child.keys()):
        if OmegaConf.is_missing(child, key):
            continue
        node = child[key]
        if isinstance(node, DictConfig) and node.get("_override_", False):
            node.pop("_override_")
            if key in base:
                base.pop(key)
    merged = OmegaConf.merge(base, child)
    assert isinstance(merged, DictConfig)
    return merged


def _malformed(err: yaml.YAMLError) -> ValueError:
    return ValueError(f"malformed YAML: {' '.join(str(err).split())}")


def _load_tree(path: Path, chain: tuple[Path, ...]) -> DictConfig:
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise ValueError(f"defaults: inheritance cycle {cycle}")
    if not path.is_file():
        where = f" (a defaults: entry of {chain[-1]})" if chain else ""
        raise FileNotFoundError(f"config {path} does not exist{where}")
    try:
        cfg = OmegaConf.load(path)
    except yaml.YAMLError as err:  # names the file, line and column
        raise _malformed(err) from None
    if not isinstance(cfg, DictConfig):
        raise TypeError(f"{path}: expected a YAML mapping at the top level, got a list")
    if "defaults" not in cfg:
        return cfg
    parents = cfg.pop("defaults")
    if isinstance(parents, str):
        parents = [parents]
    elif isinstance(parents, ListConfig):
        parents = [str(p) for p in parents]
    else:
        raise TypeError(f"{path}: defaults: expected a path or a list of paths, got {parents!r}")
    merged = OmegaConf.create({})
    for parent in parents:
        parent_path = Path(parent) if parent.startswith("/") else path.parent / parent
        merged = _merge(merged, _load_tree(parent_path.resolve(), (*chain, path)))
    return _merge(merged, cfg)


# Hydra's override grammar for unquoted scalars (what parse_hydra_overrides produces).
_INT = re.compile(r"[+-]?(0|[1-9](_?[0-9])*)")
_FLOAT = re.compile(
    r"[+-]?(([0-9](_?[0-9])*)?\.[0-9](_?[0-9])*|[0-9](_?[0-9])*\.?)([eE][+-]?[0-9](_?[0-9])*)?"
    r"|[+-]?(inf|nan)",
    re.IGNORECASE,
)


def _parse_value(raw: str) -> Any:
    """An override value as Hydra types it (null, bool, int, float, list/dict, else str)."""
    text = raw.strip()
    if text.lower() == "null":
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _INT.fullmatch(text):
        return int(text.replace("_", ""))
    if _FLOAT.fullmatch(text):
        return float(text.replace("_", ""))
    if text.startswith(("[", "{")):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"{raw!r} is no YAML list or mapping ({err.problem})") from None
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _override_value(item: str, raw: str) -> Any:
    try:
        return _parse_value(raw)
    except ValueError as err:
        raise ValueError(f"override {item!r}: {err}") from None


def _present(cfg: DictConfig, key: str) -> bool:
    """``key`` is in ``cfg``, a mandatory value (``???``) included (``select`` says absent)."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, default=None) if parent_key else cfg
    return isinstance(parent, DictConfig) and leaf in parent.keys()  # `in parent` skips ???


def apply_overrides(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """Apply Hydra overrides as NeMo-RL's ``parse_hydra_overrides`` does (struct mode).

    ``a.b=v`` sets an existing key (merging a dict value), ``+a.b=v`` adds a key that is
    absent or null, ``++a.b=v`` adds or sets, ``~a.b`` (or ``~a.b=v``, if the value is v)
    deletes. Values are typed like Hydra's (``null``, ``true``, ``8``, ``1e-6``, ``[1, 2]``;
    anything else, e.g. ``00:03:45:00``, a string).
    """
    for item in overrides:
        key, eq, raw = item.partition("=")
        if key.startswith("~"):
            key = key[1:]
            current = OmegaConf.select(cfg, key, throw_on_missing=False)
            if current is None:
                raise ValueError(f"override {item!r}: {key} is not in the config (or is null)")
            if eq and _override_value(item, raw) != current:
                raise ValueError(f"override {item!r}: {key} is {current!r}, not {raw}")
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
            parent.pop(leaf)
            continue
        if not eq:
            raise ValueError(f"override {item!r}: expected key=value, +key=value or ~key")
        value = _override_value(item, raw)
        if key.startswith("++"):
            OmegaConf.update(cfg, key[2:], value, merge=True, force_add=True)
        elif key.startswith("+"):
            key = key[1:]
            current = OmegaConf.select(cfg, key, throw_on_missing=False)
            if current is not None and not isinstance(value, (dict, list)):
                raise ValueError(
                    f"override {item!r}: {key} is already in the config (write {item[1:]} to "
                    f"set it, or +{item} to add or set)"
                )
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
        else:
            if not _present(cfg, key):
                raise ValueError(f"override {item!r}: {key} is not in the config (write +{key}=... to add a key)")
            OmegaConf.update(cfg, key, value, merge=True)
    return cfg


def load_config_fallback(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """NeMo-RL's ``load_config`` + ``parse_hydra_overrides``, re-implemented (no NeMo-RL, no hydra).

    ``defaults:`` (paths relative to the file, or absolute) resolve depth-first, later entries
    and the child winning; ``_override_: true`` replaces the inherited section; a ``???``
    value waits for a child or an override (NeMo-RL main); then :func:`apply_overrides`. Raises ``FileNotFoundError`` or ``ValueError`` (cycle, override).
    """
    _register_resolvers()
    cfg = apply_overrides(_load_tree(Path(path).resolve(), ()), overrides)
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return data
