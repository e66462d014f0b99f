# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""configs/nemo_rl/ against NeMo-RL v0.7.0 itself: its loader and its GRPO MasterConfig.

Skips cleanly without NeMo-RL (this project's CI). To run it: Python >= 3.12 (NeMo-RL's
TypedDict configs need it for pydantic), torch, and a NeMo-RL v0.7.0 checkout on
PYTHONPATH, e.g. (see docs/cluster.md)::

    PYTHONPATH=/path/to/NeMo-RL:. python3.13 -m pytest tests/adapters/test_master_config.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.nemo_rl

import nemo_rl.utils.config as nemo_rl_config  # noqa: E402
from nemo_rl.algorithms import grpo  # noqa: E402  (Python 3.11: tests/_nemo_rl_env shim)
from omegaconf import OmegaConf  # noqa: E402

from nemo_ais.nemo_rl import cluster_check as cc  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "nemo_rl"
FULL_CONFIGS = sorted(p for p in CONFIG_DIR.rglob("*.yaml") if not cc.is_mixin(cc.load_config(p)))


def _nemo_rl_load(path: Path, overrides: list[str] = ()) -> dict:
    nemo_rl_config.register_omegaconf_resolvers()
    cfg = nemo_rl_config.load_config(str(path))
    if overrides:
        cfg = nemo_rl_config.parse_hydra_overrides(cfg, list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def _rel(path: Path) -> str:
    return str(path.relative_to(CONFIG_DIR))


def test_full_configs_found():
    assert len(FULL_CONFIGS) >= 13  # base, 4 model configs, 8 arm experiments


@pytest.mark.parametrize("path", FULL_CONFIGS, ids=_rel)
def test_config_is_a_valid_grpo_master_config(path):
    config = _nemo_rl_load(path)
    grpo.MasterConfig.model_validate(config)  # raises pydantic.ValidationError


@pytest.mark.parametrize("path", FULL_CONFIGS, ids=_rel)
def test_our_loader_equals_nemo_rl_loader(path):
    assert cc.load_config(path) == _nemo_rl_load(path)


def test_our_overrides_equal_nemo_rl_overrides():
    path = CONFIG_DIR / "qwen3_8b_2n8g_fp8.yaml"
    overrides = ["loss_fn.ais.mode=tis", "cluster.num_nodes=4", "+policy.extra_knob=3"]
    assert cc.load_config(path, overrides) == _nemo_rl_load(path, overrides)


@pytest.mark.parametrize("path", FULL_CONFIGS, ids=_rel)
def test_loss_section_validates_as_ais_loss_config(path):
    from nemo_ais.nemo_rl import validate_loss_config

    loss = validate_loss_config(cc.load_config(path)["loss_fn"])
    assert loss.ais.mode in {"none", "tis", "ais"}
    assert loss.use_importance_sampling_correction is False


def test_conflict_table_matches_the_adapter():
    from nemo_ais.nemo_rl import loss as adapter_loss

    assert adapter_loss.AIS_CONFLICTS is cc.AIS_CONFLICTS  # one table, not two in step


def test_adapter_rejects_what_cluster_check_rejects():
    from nemo_ais.nemo_rl import validate_loss_config

    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    bad = cc.load_config(path, ["loss_fn.use_importance_sampling_correction=true"])
    with pytest.raises(ValueError, match="use_importance_sampling_correction"):
        validate_loss_config(bad["loss_fn"])
    with pytest.raises(ValueError, match="use_importance_sampling_correction"):
        cc.validate_config(bad)
