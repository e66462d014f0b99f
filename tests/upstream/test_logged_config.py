# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""What reaches NeMo-RL's loggers and each checkpoint's ``config.yaml`` (issue 27, item 6).

The launcher hands ``grpo.setup()`` / ``grpo_train`` a driver view of the user's config
(NeMo-RL's IS flag on; ``force_on_policy_ratio`` on under ``loss_fn.ais.bypass``). NeMo-RL
writes ``master_config.model_dump()`` to every logger (``grpo.setup``) and into each
checkpoint (``CheckpointManager.init_tmp_checkpoint``). Through upstream's REAL ``Logger``
(TensorBoard backend, read back from its event file; W&B's ``LoggerInterface`` with its
run -- the network client -- recorded) and REAL ``CheckpointManager``, the recorded config
must be the user's ``loss_fn`` plus the ``nemo_ais_run`` marker, while the driver keeps
reading the view.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml
from nemo_rl.algorithms import grpo
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig
from nemo_rl.utils.checkpoint import CheckpointManager
from nemo_rl.utils.logger import Logger, WandbLogger
from nemo_rl_version import per_version
from shipped_configs import CONFIG_DIR, launcher

from nemo_ais.nemo_rl.run_config import RUN_MARKER_KEY, AISMasterConfig, ais_master_config

pytestmark = pytest.mark.nemo_rl

run = launcher()
SMOKE = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
BYPASS = ["loss_fn.ais.bypass=true"]
DRIVER_ONLY = {"loss_fn.use_importance_sampling_correction": True, "loss_fn.force_on_policy_ratio": True}


def _master(overrides):
    raw = run.load_config_dict(str(SMOKE), list(overrides))
    ais_cfg = run.validate_ais(raw)
    return raw, ais_master_config(raw, run.nemo_rl_view(raw, ais_cfg), ais_cfg)


def test_upstream_dumps_the_master_config_only_to_its_loggers_and_checkpoints():
    # the seam this module relies on, pinned in both versions' source
    assert "logger.log_hyperparams(master_config.model_dump())" in inspect.getsource(grpo.setup)
    source = inspect.getsource(CheckpointManager.init_tmp_checkpoint)
    assert "yaml.safe_dump(run_config.model_dump(), f)" in source


def test_the_driver_reads_the_view():
    raw, master = _master(BYPASS)
    assert isinstance(master, grpo.MasterConfig) and isinstance(master, AISMasterConfig)
    assert master.loss_fn.use_importance_sampling_correction is True
    assert master.loss_fn.force_on_policy_ratio is True
    assert raw["loss_fn"]["use_importance_sampling_correction"] is False


def _tensorboard_hparams(log_dir: Path) -> dict:
    """The hparams TensorBoard's writer recorded under ``log_dir`` (its plugin's proto)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    found = {}
    for path in log_dir.rglob("events.out.tfevents.*"):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name != "hparams":
                    continue
                data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                for name, v in data.session_start_info.hparams.items():
                    found[name] = v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
    return found


class _WandbRun:
    """W&B's run (the network client): records ``config.update``."""

    def __init__(self) -> None:
        self.config = self
        self.updates: list[dict] = []

    def update(self, params, allow_val_change=False):
        self.updates.append(dict(params))


def test_the_loggers_record_the_users_loss_fn_and_the_marker(tmp_path):
    raw, master = _master(BYPASS)
    cfg = {**raw["logger"], "log_dir": str(tmp_path), "wandb_enabled": False}
    cfg.update(tensorboard_enabled=True, mlflow_enabled=False, swanlab_enabled=False)
    cfg["monitor_gpus"] = False
    logger = Logger(cfg)
    wandb = WandbLogger.__new__(WandbLogger)  # no wandb.init: only its run is stood in for
    wandb.run = _WandbRun()
    logger.loggers.append(wandb)
    logger.log_hyperparams(master.model_dump())  # what grpo.setup does
    for backend in logger.loggers:
        getattr(backend, "writer", None) and backend.writer.flush()

    (logged,) = wandb.run.updates
    assert logged["loss_fn"] == raw["loss_fn"]
    assert logged["loss_fn"]["use_importance_sampling_correction"] is False
    assert logged["loss_fn"]["force_on_policy_ratio"] is False
    marker = logged[RUN_MARKER_KEY]
    assert marker["loss"] == "nemo_ais.nemo_rl.AISClippedPGLossFn"
    assert (marker["mode"], marker["bypass"]) == (raw["loss_fn"]["ais"]["mode"], True)
    assert marker["driver_view"] == DRIVER_ONLY

    hparams = _tensorboard_hparams(tmp_path / "tensorboard")  # bools arrive as 0.0 / 1.0
    assert hparams["loss_fn.use_importance_sampling_correction"] == 0.0
    assert hparams["loss_fn.force_on_policy_ratio"] == 0.0
    assert hparams["loss_fn.ais.bypass"] == 1.0
    assert hparams[f"{RUN_MARKER_KEY}.loss"] == "nemo_ais.nemo_rl.AISClippedPGLossFn"
    assert hparams[f"{RUN_MARKER_KEY}.bypass"] == 1.0


def _save_state() -> dict:
    return per_version(
        v0_7_0=lambda: grpo._default_grpo_save_state(), main=lambda: vars(grpo._initial_grpo_save_state())
    )()


@pytest.mark.parametrize("overrides", [[], BYPASS], ids=["ais", "bypass"])
def test_each_checkpoint_saves_the_users_loss_fn_and_reruns(overrides, tmp_path):
    raw, master = _master(overrides)
    checkpointer = CheckpointManager({**master.checkpointing, "checkpoint_dir": str(tmp_path)})
    path = Path(checkpointer.init_tmp_checkpoint(3, _save_state(), master))
    saved = yaml.safe_load((path / "config.yaml").read_text())
    assert saved["loss_fn"] == raw["loss_fn"]
    expected_view = {**DRIVER_ONLY} if overrides else {k: DRIVER_ONLY[k] for k in list(DRIVER_ONLY)[:1]}
    assert saved[RUN_MARKER_KEY]["driver_view"] == expected_view
    assert {k: v for k, v in saved.items() if k not in ("loss_fn", RUN_MARKER_KEY)} == {
        k: v for k, v in master.model_dump().items() if k not in ("loss_fn", RUN_MARKER_KEY)
    }
    # upstream's run_grpo.py would build its loss from this: NeMo-RL's IS off, no zeroed
    # prev_logprobs (nothing corrected twice; no force_on_policy_ratio)
    upstream = ClippedPGLossConfig(**saved["loss_fn"])
    assert upstream.use_importance_sampling_correction is False
    assert upstream.force_on_policy_ratio is False
    # our launcher re-runs the saved file to the same driver view
    rerun_raw = run.load_config_dict(str(path / "config.yaml"), [])
    ais_cfg = run.validate_ais(rerun_raw)
    rerun = ais_master_config(rerun_raw, run.nemo_rl_view(rerun_raw, ais_cfg), ais_cfg)
    assert rerun.loss_fn == master.loss_fn
    assert rerun.model_dump() == master.model_dump()


def test_the_master_config_survives_pickling_and_copies():
    # Ray pickles what it ships (async GRPO hands master_config to actors): the user's
    # loss_fn and the marker travel with the view
    import copy
    import pickle

    _, master = _master(BYPASS)
    for clone in (pickle.loads(pickle.dumps(master)), copy.deepcopy(master)):
        assert clone.model_dump() == master.model_dump()
        assert clone.loss_fn.force_on_policy_ratio is True
