# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Load a NeMo-RL GRPO config the way NeMo-RL's entry point does, and read dotted keys.

:func:`load_config` IS NeMo-RL's loader (``nemo_rl.utils.config``) when NeMo-RL is
importable, else :func:`load_config_fallback`, a re-implementation (omegaconf, pyyaml and Hydra's parser
only) that ``tests/adapters/test_master_config.py`` proves equal on every shipped config.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from nemo_ais.rules.config_keys import get as get, has


def is_mixin(cfg: Mapping[str, Any]) -> bool:
    """True for an arm mixin, a ``loss_fn.ais`` delta without ``policy``/``cluster``; anything else is a full config."""
    return has(cfg, "loss_fn.ais") and ("policy" not in cfg or "cluster" not in cfg)


def nemo_rl_loader() -> ModuleType | None:
    """``nemo_rl.utils.config`` (NeMo-RL's loader: omegaconf + hydra), or None if absent."""
    try:
        import nemo_rl.utils.config as nemo_rl_config
    except ImportError:
        return None
    return nemo_rl_config


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load a config exactly as NeMo-RL's entry point does, apply overrides, resolve: a plain dict, no ``defaults``."""
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
    # NeMo-RL's resolvers (main's: v0.7.0 lacks add), same names and meaning, so its YAML interpolations resolve here.
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
    # `_override_: true` replaces the inherited section; a `???` waits for a child or an override (main; v0.7.0 raised).
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
    # A parent resolves against the directory ``path`` is named in, a symlink's (as NeMo-RL's loader does); the
    # chain holds resolved paths, for the cycle check.
    if path.resolve() in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path.resolve()))
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
        merged = _merge(merged, _load_tree(parent_path, (*chain, path.resolve())))
    return _merge(merged, cfg)


def apply_overrides(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """Apply Hydra overrides as NeMo-RL's ``parse_hydra_overrides`` does: Hydra's own parser, struct mode.

    ``a.b=v`` sets an existing key, ``+a.b=v`` adds one, ``++a.b=v`` adds or sets, ``~a.b`` deletes; values are typed
    by Hydra's grammar (``null``, ``true``, ``8``, ``[1, 2]``, ``{a: 1}``; ``007``, ``00:03:45:00``: strings).

    Raises:
        ValueError: an override Hydra refuses, with Hydra's reason.
    """
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides)
    if not overrides:
        return cfg
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException
    except ImportError as err:
        raise ValueError(f"overrides {overrides} need hydra-core>=1.3 (pip install 'hydra-core>=1.3'): {err}") from None
    OmegaConf.set_struct(cfg, True)  # a plain key=value cannot add a key, nested in a dict value either
    try:
        ConfigLoaderImpl._apply_overrides_to_config(
            overrides=OverridesParser.create().parse_overrides(overrides), cfg=cfg
        )
    except (HydraException, OmegaConfBaseException, ValueError, TypeError) as err:
        raise ValueError(f"overrides {overrides}: {' '.join(str(err).split())}") from None
    return cfg


def load_config_fallback(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """NeMo-RL's ``load_config`` + ``parse_hydra_overrides``, re-implemented (no NeMo-RL; Hydra's override parser).

    ``defaults:`` (paths relative to the file, or absolute) resolve depth-first, later entries and the child winning;
    ``_override_: true`` replaces the inherited section; a ``???`` value waits for a child or an override (NeMo-RL
    main); then :func:`apply_overrides`. Raises ``FileNotFoundError`` or ``ValueError`` (cycle, override).
    """
    _register_resolvers()
    cfg = apply_overrides(_load_tree(Path(path), ()), overrides)
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return data
