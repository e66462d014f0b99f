# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""launchers/run_grpo_ais.py main() through NeMo-RL v0.7.0's REAL driver code, every config.

For every full config under ``configs/nemo_rl/`` (recursive, arm mixins excluded) the
launcher runs with upstream's real ``load_config`` / ``parse_hydra_overrides`` /
``register_omegaconf_resolvers``, real ``MasterConfig``, real ``get_next_experiment_dir``
and real ``configure_generation_config``. Stubbed, at the narrowest boundary, only what
needs a cluster, a download or a GPU; each stub records what crossed it:

* ``init_ray`` (starts Ray): records the worker environment at that moment;
* ``get_tokenizer`` (HF download): records its config, returns :class:`Tokenizer`;
* ``setup_response_data`` (dataset download): records its arguments;
* ``grpo.setup`` (Ray actors, vLLM, Megatron): records (config, tokenizer, dataset,
  val_dataset, policy_factory) and returns what upstream's setup returns, with the real
  ``ClippedPGLossFn`` built from the config it received;
* ``grpo.grpo_train`` / ``grpo.async_grpo_train`` (the GPU loops): record their arguments;
* ``grpo.shutdown_environments`` (NeMo-RL main: stops the environments' Ray actors after
  training, as main's ``run_grpo.py``): records its arguments.

Each stub replaces the name in the module where ``main()`` looks it up (``main()``
imports them at call time; the stand-ins live in ``_ray_boundary.py``). Upstream's REAL
``grpo.setup`` runs to its return, for every config, in ``test_setup_real.py``.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
from _ray_boundary import DriverBoundary, Tokenizer
from nemo_rl.algorithms import grpo
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn
from nemo_rl.models.generation import configure_generation_config
from nemo_rl_version import per_version
from shipped_configs import CONFIG_DIR, FULL_CONFIGS, launcher

from nemo_ais.nemo_rl import AISClippedPGLossFn

pytestmark = pytest.mark.nemo_rl

REPO_ROOT = Path(__file__).resolve().parents[2]

run = launcher()


class _Generation:
    """What ``setup()`` returns for the vLLM engines: records ``shutdown`` (main calls it)."""

    def __init__(self, events: list) -> None:
        self.events = events

    def shutdown(self) -> bool:
        self.events.append(("policy_generation.shutdown", {}))
        return True


# what main() does after training, per NeMo-RL version (main's run_grpo.py does the same)
AFTER_TRAINING = per_version(
    v0_7_0=[], main=["shutdown_environments", "policy_generation.shutdown"]
)


class _Driver(DriverBoundary):
    """``_ray_boundary.DriverBoundary`` plus a recording stand-in for all of ``grpo.setup``."""

    def setup(
        self, master_config, tokenizer, dataset, val_dataset, processor=None, policy_factory=None
    ):
        self.events.append(
            (
                "setup",
                {
                    "config": master_config,
                    "tokenizer": tokenizer,
                    "dataset": dataset,
                    "val_dataset": val_dataset,
                    "policy_factory": policy_factory,
                },
            )
        )
        # What upstream's setup() returns in the loss slot: ClippedPGLossFn(master_config.loss_fn).
        loss_fn = ClippedPGLossFn(master_config.loss_fn)
        return ("policy", _Generation(self.events), None, ("train_cluster", "inference_cluster"),
                "dataloader", "val_dataloader", loss_fn, "logger", "checkpointer",
                {"current_step": 0}, master_config, {}, {})  # fmt: skip


@pytest.fixture
def driver(monkeypatch, tmp_path):
    d = _Driver()
    d.install(monkeypatch)
    monkeypatch.setattr(grpo, "setup", d.setup)
    # main() edits the worker environment; restore it after each test.
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("NEMO_AIS_FP8_REFIT", raising=False)
    monkeypatch.chdir(tmp_path)  # logger.log_dir / checkpoint_dir are relative
    return d


def _rel(path: Path) -> str:
    return str(path.relative_to(CONFIG_DIR))


def test_every_shipped_full_config_is_driven():
    assert len(FULL_CONFIGS) == 13, [_rel(p) for p in FULL_CONFIGS]


@pytest.mark.parametrize("path", FULL_CONFIGS, ids=_rel)
def test_main_reaches_setup_and_trains_with_upstreams_driver_code(driver, path):
    raw = run.load_config_dict(str(path), [])
    ais_cfg = run.validate_ais(raw)

    run.main(["--config", str(path)])

    assert driver.names() == [
        "init_ray",
        "get_tokenizer",
        "setup_response_data",
        "setup",
        "grpo_train",
        *AFTER_TRAINING,
    ]
    events = dict(driver.events)
    if AFTER_TRAINING:  # the environments main() got from setup_response_data
        assert events["shutdown_environments"]["envs"] == driver.datasets[2:]
    # Ray workers inherit the driver's environment: this checkout is importable there.
    assert str(run.REPO_ROOT) in events["init_ray"]["env"]["PYTHONPATH"].split(os.pathsep)
    assert events["get_tokenizer"]["config"] == raw["policy"]["tokenizer"]

    setup = events["setup"]
    config = setup["config"]
    assert isinstance(config, grpo.MasterConfig)
    assert setup["tokenizer"] is driver.tokenizer
    assert (setup["dataset"], setup["val_dataset"]) == driver.datasets[:2]
    assert events["setup_response_data"]["data"] == raw["data"]
    assert events["setup_response_data"]["env"] == raw["env"]
    # policy.generation exactly as upstream's configure_generation_config makes it.
    expected_generation = configure_generation_config(
        copy.deepcopy(raw["policy"]["generation"]),
        Tokenizer(),
        has_refit_draft_weights=False,
        trains_mtp=bool(raw["policy"]["megatron_cfg"].get("mtp_num_layers")),
    )
    assert config.policy["generation"] == expected_generation
    assert config.policy["generation"]["_pad_token_id"] == Tokenizer.pad_token_id
    assert config.policy["generation"]["stop_token_ids"] == [Tokenizer.eos_token_id]
    assert config.policy["generation"]["vllm_cfg"]["load_format"] == "dummy"
    assert config.policy["draft"] == raw["policy"]["draft"]
    assert config.policy["draft"]["enabled"] is False
    # loss_fn view: loss_fn.ais owns the correction, so NeMo-RL's FP8 guard reads it as on.
    assert config.loss_fn.use_importance_sampling_correction is True
    assert raw["loss_fn"]["use_importance_sampling_correction"] is False
    assert callable(setup["policy_factory"])  # every arm, mode none included: the AIS worker
    # The next experiment directory under the configured log_dir (upstream's helper).
    assert config.logger["log_dir"] == os.path.join(raw["logger"]["log_dir"], "exp_001")

    args = events["grpo_train"]["args"]
    assert len(args) == 12
    loss_fn = args[5]
    assert isinstance(loss_fn, AISClippedPGLossFn)
    assert loss_fn.ais == ais_cfg.ais
    assert args[4] is driver.tokenizer
    assert args[6] is driver.datasets[2] and args[7] is driver.datasets[3]
    assert args[11] is config


def test_main_runs_async_grpo_with_the_ais_loss(driver):
    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    # async GRPO needs a BF16 KV cache (upstream's setup asserts it; so does cluster_check)
    run.main(
        [
            "--config",
            str(path),
            "grpo.async_grpo.enabled=true",
            "grpo.async_grpo.max_trajectory_age_steps=2",
            "policy.generation.vllm_cfg.kv_cache_dtype=auto",
        ]
    )
    assert driver.names()[-1 - len(AFTER_TRAINING) :] == ["async_grpo_train", *AFTER_TRAINING]
    kwargs = driver.event("async_grpo_train")
    assert isinstance(kwargs["loss_fn"], AISClippedPGLossFn)
    assert kwargs["max_trajectory_age_steps"] == 2
    grpo_cfg = kwargs["master_config"].grpo  # v0.7.0: a dict; main: a pydantic model
    enabled = per_version(
        v0_7_0=lambda: grpo_cfg["async_grpo"]["enabled"],
        main=lambda: grpo_cfg.async_grpo.enabled,
    )
    assert enabled() is True


def test_bad_ais_config_fails_before_ray(driver):
    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    with pytest.raises(ValueError, match=r"loss_fn\.ais\.weight_cap=0\.5 is invalid"):
        run.main(["--config", str(path), "loss_fn.ais.weight_cap=0.5"])
    assert driver.events == []


def test_data_plane_is_refused_before_ray_for_every_mode(driver):
    # Upstream's run_grpo.py builds TQPolicy and runs grpo_train_sync for data_plane.enabled;
    # the AIS worker is not composed with TQPolicy, so every arm refuses it, before Ray starts.
    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    for mode in ("none", "tis", "ais"):
        with pytest.raises(
            ValueError, match=r"data_plane\.enabled=true .*set data_plane\.enabled=false"
        ):
            run.main(
                ["--config", str(path), f"loss_fn.ais.mode={mode}", "+data_plane.enabled=true"]
            )
    assert driver.events == []


def test_val_at_start_with_fp8_kv_cache_is_refused_before_ray(driver):
    # grpo_train refits for the initial validation before any KV calibration (v0.7.0):
    # the worker's guard would stop that refit on the cluster; the launcher stops it here.
    path = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
    with pytest.raises(ValueError, match=r"grpo\.val_at_start=true with .*kv_cache_dtype='fp8'"):
        run.main(["--config", str(path), "grpo.val_at_start=true"])
    assert driver.events == []
    # a BF16 KV cache (the bf16 arm) needs no calibration: accepted, reaches setup()
    bf16 = CONFIG_DIR / "experiments" / "smoke_bf16.yaml"
    run.main(["--config", str(bf16), "grpo.val_at_start=true"])
    assert driver.names()[-2 - len(AFTER_TRAINING) :] == ["setup", "grpo_train", *AFTER_TRAINING]
