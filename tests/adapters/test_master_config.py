# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""configs/nemo_rl/ against NeMo-RL itself (v0.7.0, or main with --nemo-rl main): its loader and its GRPO MasterConfig.

NeMo-RL is the vendored v0.7.0 source (tests/conftest.py; Python 3.11 via the harness's
TypedDict shim). ``cluster_check.load_config`` IS NeMo-RL's loader when NeMo-RL is
importable; its fallback (no NeMo-RL: a laptop, the launchers' pre-flight check) must give
exactly upstream's dict, or the same refusal, for every shipped config and override example.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.nemo_rl

import nemo_rl.utils.config as nemo_rl_config  # noqa: E402
from nemo_rl.algorithms import grpo  # noqa: E402  (Python 3.11: tests/_nemo_rl_env shim)
from nemo_rl_version import per_version  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from shipped_configs import CONFIG_DIR, FULL_CONFIGS  # noqa: E402

from nemo_ais import preflight as cc  # noqa: E402
from nemo_ais.preflight.loader import nemo_rl_loader  # noqa: E402


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


ALL_CONFIGS = sorted(CONFIG_DIR.rglob("*.yaml"))  # arm mixins included
QWEN8B = "qwen3_8b_2n8g_fp8.yaml"

# (config, overrides): the override examples of docs/ and configs/ on the config they are
# documented for, then Hydra's typing and struct rules where YAML would read differently.
OVERRIDE_EXAMPLES: dict[str, tuple[str, list[str]]] = {
    "nodes (docs/cluster.md)": ("qwen3_30b_a3b_2n8g_fp8_ep8.yaml", ["cluster.num_nodes=4"]),
    "gpus (smoke header)": ("smoke_qwen3_0.6b_1n.yaml", ["cluster.gpus_per_node=8"]),
    "vllm tp (docs/cluster.md)": (QWEN8B, ["policy.generation.vllm_cfg.tensor_parallel_size=4"]),
    "nemo-rl tis arm (docs/cluster.md)": (
        "experiments/qwen3_8b_fp8_none.yaml",
        [
            "loss_fn.ais.mode=none",
            "loss_fn.use_importance_sampling_correction=true",
            "loss_fn.truncated_importance_sampling_type=tis",
            "loss_fn.truncated_importance_sampling_ratio=2.0",
        ],
    ),
    "mode tis (docs/cluster.md)": (QWEN8B, ["loss_fn.ais.mode=tis"]),
    "mode on a mixin": ("arms/fp8_none.yaml", ["loss_fn.ais.mode=tis"]),
    "bad cap (docs/nemo_rl.md)": (QWEN8B, ["loss_fn.ais.weight_cap=0.8"]),
    # docs/nemo_rl.md: "+" on a key the YAML has; NeMo-RL refuses it, so must the fallback
    "plus on existing (docs/nemo_rl.md)": (QWEN8B, ["loss_fn.ais.mode=ais", "+loss_fn.ais.ema=0.9"]),
    "new key (docs/cluster.md)": (QWEN8B, ["+new.k=v"]),
    "new key (launchers/README.md)": ("arms/bf16.yaml", ["+new.key=value"]),
    "unknown key": (QWEN8B, ["new.k=v"]),
    "typing": (
        QWEN8B,
        [
            "checkpointing.checkpoint_must_save_by=00:03:45:00",  # YAML 1.1: 13500
            "policy.megatron_cfg.optimizer.lr=1e-6",  # YAML 1.1: a string
            "logger.wandb.name=on",  # YAML 1.1: True
            "grpo.val_batch_size=null",
            "policy.megatron_cfg.env_vars={A: '1'}",
        ],
    ),
    # where a YAML reading or a plain dict merge differs from Hydra's grammar and struct mode
    "dict value adds a key": (QWEN8B, ["policy.generation.vllm_kwargs={moe_backend: triton}"]),
    "dict without a space": (QWEN8B, ["++policy.generation.vllm_kwargs={moe_backend:triton}"]),
    "leading zeros": (QWEN8B, ["++grpo.tag=007", "++grpo.tag2=01.5"]),
    "a sweep": (QWEN8B, ["grpo.seed=1,2"]),
    "an unquoted equals sign": (QWEN8B, ["++grpo.tag=a=b"]),
    "a cast": (QWEN8B, ["++grpo.tag=int(3.0)"]),
    "an escaped space": (QWEN8B, ["++grpo.tag=a\\ b"]),
    "a list index": (QWEN8B, ["++policy.generation.stop_token_ids=[1, 2]", "policy.generation.stop_token_ids.0=7"]),
    "an index past the end": (
        QWEN8B,
        ["++policy.generation.stop_token_ids=[1]", "+policy.generation.stop_token_ids.3=7"],
    ),
    "delete / force-add / add-to-null": (
        QWEN8B,
        [
            "~policy.draft",
            "++grpo.seed=7",
            "++grpo.new_knob=[1, 2]",
            "+policy.optimizer={name: adam}",
            "grpo.async_grpo.enabled=true",
        ],
    ),
    "dict value merges": (QWEN8B, ["policy.megatron_cfg.optimizer={lr: 2.0e-6}"]),
    "delete with a wrong value": (QWEN8B, ["~grpo.seed=41"]),
    "delete a null": (QWEN8B, ["~policy.optimizer"]),
}


def _outcome(load, path: Path, overrides: list[str]):
    try:
        return load(path, overrides)
    except Exception as err:  # both must refuse the same overrides
        return ("raises", type(err).__name__)


def _same(path: Path, overrides: list[str]):
    upstream = _outcome(_nemo_rl_load, path, overrides)
    fallback = _outcome(cc.load_config_fallback, path, overrides)
    if isinstance(upstream, tuple):
        assert upstream == ("raises", "OverridesError")
        assert fallback == ("raises", "ValueError")
    else:
        assert fallback == upstream
    return upstream


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=_rel)
def test_fallback_loader_equals_nemo_rl_loader(path):
    assert isinstance(_same(path, []), dict)


@pytest.mark.parametrize(("config", "overrides"), OVERRIDE_EXAMPLES.values(), ids=OVERRIDE_EXAMPLES.keys())
def test_fallback_overrides_equal_nemo_rl_overrides(config, overrides):
    _same(CONFIG_DIR / config, overrides)


def test_examples_exercise_both_outcomes():
    refused = [
        name
        for name, (config, overrides) in OVERRIDE_EXAMPLES.items()
        if isinstance(_outcome(_nemo_rl_load, CONFIG_DIR / config, overrides), tuple)
    ]
    assert refused == [
        "plus on existing (docs/nemo_rl.md)",
        "unknown key",
        "dict value adds a key",
        "a sweep",
        "an unquoted equals sign",
        "an index past the end",
        "delete with a wrong value",
        "delete a null",
    ]
    path = CONFIG_DIR / QWEN8B
    typed = _nemo_rl_load(path, OVERRIDE_EXAMPLES["typing"][1])
    assert typed["checkpointing"]["checkpoint_must_save_by"] == "00:03:45:00"
    assert typed["policy"]["megatron_cfg"]["optimizer"]["lr"] == 1e-6
    assert typed["logger"]["wandb"]["name"] == "on"
    merged = _nemo_rl_load(path, OVERRIDE_EXAMPLES["dict value merges"][1])
    base = _nemo_rl_load(path)["policy"]["megatron_cfg"]["optimizer"]
    assert merged["policy"]["megatron_cfg"]["optimizer"] == {**base, "lr": 2.0e-6}  # merged


@pytest.mark.parametrize(
    ("body", "overrides", "v0_7_0"),
    [
        # examples/nemo_gym/nemotron-3-ultra/*.yaml on main interpolate with ${add:...}
        ("grpo:\n  max_num_steps: ${add:${grpo.val_period}, 1}\n", [], "UnsupportedInterpolationType"),
        # a mandatory value an override sets, and one left unset (the dict holds "???")
        ("run_tag: ???\n", ["run_tag=x"], "MissingMandatoryValue"),
        ("run_tag: ???\n", [], "MissingMandatoryValue"),
    ],
)
def test_fallback_composes_as_main_does(tmp_path, body, overrides, v0_7_0):
    # the launchers' offline check runs the fallback on a login node without NeMo-RL: it
    # follows main, which loads what v0.7.0 loads and these two more
    child = tmp_path / "child.yaml"
    child.write_text(f"defaults: {CONFIG_DIR / QWEN8B}\n{body}")
    OmegaConf.clear_resolver("add")  # resolvers are process-wide: as on a fresh start
    upstream = _outcome(_nemo_rl_load, child, overrides)
    fallback = cc.load_config_fallback(child, overrides)
    assert upstream == per_version(v0_7_0=("raises", v0_7_0), main=fallback)
    base = cc.load_config_fallback(CONFIG_DIR / QWEN8B)
    if "add" in body:
        assert fallback["grpo"]["max_num_steps"] == base["grpo"]["val_period"] + 1
    else:
        assert fallback == {**base, "run_tag": "x" if overrides else "???"}


def test_load_config_is_nemo_rl_loader_when_importable():
    path = CONFIG_DIR / "qwen3_8b_2n8g_fp8.yaml"
    assert nemo_rl_loader() is nemo_rl_config
    assert cc.load_config(path) == _nemo_rl_load(path)
    # NeMo-RL's own refusal (Hydra's message), raised as ValueError for the CLI
    with pytest.raises(ValueError, match=r"Could not append to config.*loss_fn\.ais\.ema"):
        cc.load_config(path, ["+loss_fn.ais.ema=0.9"])


@pytest.mark.parametrize("path", FULL_CONFIGS, ids=_rel)
def test_loss_section_validates_as_ais_loss_config(path):
    from nemo_ais.nemo_rl import validate_loss_config

    loss = validate_loss_config(cc.load_config(path)["loss_fn"])
    assert loss.ais.mode in {"none", "tis", "ais", "tbpo"}  # tbpo: the QARL arm
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


def test_fallback_finds_a_parent_beside_a_symlink_as_upstream(tmp_path):
    """``a/child.yaml`` links to ``../b/child.yaml``: its ``defaults: parent.yaml`` is ``a/parent.yaml`` upstream."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "parent.yaml").write_text(f"v: from_{folder}\n")
    (tmp_path / "b" / "child.yaml").write_text("defaults: parent.yaml\nw: 1\n")
    (tmp_path / "a" / "child.yaml").symlink_to(Path("..") / "b" / "child.yaml")
    assert _nemo_rl_load(tmp_path / "a" / "child.yaml") == {"v": "from_a", "w": 1}
    assert cc.load_config_fallback(tmp_path / "a" / "child.yaml") == {"v": "from_a", "w": 1}
