# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The online refit guard: ``loss_fn.ais_alarms`` through the real worker mixin and loss.

A worker stand-in (as in ``test_nemo_rl_seam_unit.py``) with :class:`AISTrainMixin` in its
bases trains on upstream's ``BatchedDataDict`` and calls the real
:class:`AISClippedPGLossFn` once per micro-batch, summing the metrics as NeMo-RL's GRPO
does. Each "step" is one ``train()`` call of one global batch; step 5 has a broken refit
(20x the rollout noise of steps 1-4).
"""

from __future__ import annotations

import json
import math
import os

import nemo_rl  # noqa: F401  (required: tests/conftest.py)
import pytest
import torch
import torch.distributed as dist
from nemo_rl.distributed.batched_data_dict import BatchedDataDict

from nemo_ais.analyze import ALARM_KINDS, RefitAlarmError
from nemo_ais.nemo_rl import AISClippedPGLossFn, validate_loss_config
from nemo_ais.nemo_rl.loss import ALARM_METRIC_KEYS, AISAlarmsConfig
from nemo_ais.nemo_rl.workers.mixin import AISTrainMixin, ais_alarm_state_path, ais_state_path

pytestmark = pytest.mark.nemo_rl

B, S = 8, 16
GBS = 8
BASE = {"reference_policy_kl_penalty": 0.0}
# a small test batch: the tail alarm opted in below its default tail_min_tokens
# jump_factor 8 (the default is 48): these tests drive the plumbing with a 20x jump
ALARMS = {"min_history": 3, "fail_on_alarm": False, "tail_min_tokens": 1, "jump_factor": 8.0}


def _data(step, sigma):
    g = torch.Generator().manual_seed(step)
    f64 = torch.float64
    token_mask = torch.ones(B, S, dtype=torch.int64)
    token_mask[:, :2] = 0
    gen = -2.0 * torch.rand(B, S, generator=g, dtype=f64) - 0.05
    return BatchedDataDict(
        {
            "input_ids": torch.zeros(B, S, dtype=torch.int64),
            "token_mask": token_mask,
            "sample_mask": torch.ones(B, dtype=torch.int64),
            "advantages": torch.randn(B, 1, generator=g, dtype=f64).expand(B, S).clone(),
            "prev_logprobs": gen + sigma * torch.randn(B, S, generator=g, dtype=f64),
            "generation_logprobs": gen,
        }
    )


class _FakeWorker:
    """A NeMo-RL worker's ``train``: per global batch, two micro-batches, metrics summed."""

    def __init__(self, config, weights_path=None):
        self.cfg = config
        self.metrics = []  # one summed dict per global batch, as GRPO reduces them

    def train(self, data, loss_fn, eval_mode=False, gbs=None, mbs=None):
        for start in range(0, data.size, gbs):
            gb = data.slice(start, start + gbs)
            mask = gb["token_mask"][:, 1:] * gb["sample_mask"].unsqueeze(-1)
            gvs, gvt = gb["sample_mask"].sum().double(), mask.sum().double()
            total: dict[str, float] = {}
            for a, b in ((0, 3), (3, gbs)):
                mb = gb.slice(a, b)
                _, m = loss_fn(mb["prev_logprobs"][:, 1:].clone(), mb, gvs, gvt)
                for k, v in m.items():
                    total[k] = total.get(k, 0.0) + v
            self.metrics.append(total)
        return {"ok": True}

    def save_checkpoint(self, weights_path, optimizer_path=None):
        os.makedirs(weights_path, exist_ok=True)


class _Worker(AISTrainMixin, _FakeWorker):
    def _ais_dp_group(self):
        return dist.group.WORLD


@pytest.fixture
def one_rank_world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _loss(mode="ais", **alarms):
    return AISClippedPGLossFn({**BASE, "ais": {"mode": mode}, "ais_alarms": {**ALARMS, **alarms}})


SIGMAS = [0.01, 0.011, 0.009, 0.01, 0.2]


@pytest.mark.parametrize("mode", ["ais", "none"])
def test_alarm_metric_is_logged_on_the_jump_step_only(one_rank_world, mode):
    worker = _Worker({"train_global_batch_size": GBS})
    for step, sigma in enumerate(SIGMAS, start=1):
        worker.train(_data(step, sigma), _loss(mode), gbs=GBS)
    for step, metrics in enumerate(worker.metrics, start=1):
        fired = {k for k in ALARM_METRIC_KEYS if not math.isclose(metrics[k], 0.0, abs_tol=1e-12)}
        assert set(ALARM_METRIC_KEYS) <= set(metrics)
        if step < 5:
            assert fired == set(), (step, metrics)
        else:  # the summed micro-batch values recover the global 0/1 scalar
            # a 20x wider mismatch moves the tails (p99.9 |l|) by >= 3 bins too
            assert fired == {"ais_alarm/tmpe_jump", "ais_alarm/severity_jump", "ais_alarm/tail_jump"}
            for key in fired:
                assert metrics[key] == pytest.approx(1.0, rel=1e-12)


def test_disabled_or_absent_section_logs_no_alarm_metric(one_rank_world):
    worker = _Worker({"train_global_batch_size": GBS})
    for step, sigma in enumerate(SIGMAS, start=1):
        worker.train(_data(step, sigma), AISClippedPGLossFn({**BASE, "ais": {"mode": "ais"}}), gbs=GBS)
    assert not any(k.startswith("ais_alarm/") for m in worker.metrics for k in m)
    assert worker.ais_alarm_monitor is None
    loss = _loss(enabled=False)
    assert not any(k.startswith("ais_alarm/") for k in loss.metric_normalizations)


def test_fail_on_alarm_raises_naming_the_batch_kind_and_evidence(one_rank_world):
    worker = _Worker({"train_global_batch_size": GBS})
    for step, sigma in enumerate(SIGMAS[:4], start=1):
        worker.train(_data(step, sigma), _loss(fail_on_alarm=True), gbs=GBS)
    with pytest.raises(RefitAlarmError) as err:
        worker.train(_data(5, SIGMAS[4]), _loss(fail_on_alarm=True), gbs=GBS)
    msg = str(err.value)
    assert msg.startswith("AIS refit guard (loss_fn.ais_alarms.fail_on_alarm=true) failed the step")
    assert "global batch 5 since the start of training (global batch 0 of 1" in msg
    assert "tmpe_jump: token_mult_prob_error - 1" in msg and "median of the previous 4" in msg
    assert "severity_jump: severity D" in msg
    assert len(worker.metrics) == 4  # the failing step never reached the optimizer


def test_eval_mode_neither_observes_nor_logs(one_rank_world):
    worker = _Worker({"train_global_batch_size": GBS})
    worker.train(_data(1, 0.01), _loss(), gbs=GBS, eval_mode=True)
    assert worker.ais_alarm_monitor is None
    assert not any(k.startswith("ais_alarm/") for k in worker.metrics[0])


def test_history_survives_checkpoint_save_and_restore(one_rank_world, tmp_path):
    worker = _Worker({"train_global_batch_size": GBS})
    for step, sigma in enumerate(SIGMAS[:4], start=1):
        worker.train(_data(step, sigma), _loss(), gbs=GBS)
    weights = str(tmp_path / "step_4" / "policy" / "weights")
    worker.save_checkpoint(weights)
    with open(ais_alarm_state_path(weights)) as f:
        saved = json.load(f)
    assert len(saved["severity"]) == 4 and saved == worker.ais_alarm_monitor.state_dict()
    with open(ais_state_path(weights)) as f:
        assert json.load(f)["num_updates"] == 4
    restored = _Worker({"train_global_batch_size": GBS}, weights_path=weights)
    with pytest.raises(RefitAlarmError, match="global batch 5 since the start"):
        restored.train(_data(5, SIGMAS[4]), _loss(fail_on_alarm=True), gbs=GBS)
    fresh = _Worker({"train_global_batch_size": GBS})  # no history: nothing to compare with
    fresh.train(_data(5, SIGMAS[4]), _loss(fail_on_alarm=True), gbs=GBS)


def test_two_global_batches_per_call_each_get_their_alarm(one_rank_world):
    worker = _Worker({"train_global_batch_size": GBS // 2})
    for step, sigma in enumerate(SIGMAS[:4], start=1):
        worker.train(_data(step, sigma), _loss(), gbs=GBS // 2)
    data = _data(5, 0.01)
    noise = torch.randn(4, S, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    data["prev_logprobs"][4:] = data["generation_logprobs"][4:] + 0.3 * noise
    worker.train(data, _loss(), gbs=GBS // 2)
    # one train() call, two global batches: only the second one's calls carry the alarm
    assert worker.metrics[-2]["ais_alarm/tmpe_jump"] == 0.0
    assert worker.metrics[-1]["ais_alarm/tmpe_jump"] == pytest.approx(1.0, rel=1e-12)
    assert len(worker.ais_alarm_monitor.state_dict()["severity"]) == 10


def test_alarm_section_validation_names_the_field():
    cfg = validate_loss_config({"ais_alarms": {}})
    assert cfg.ais_alarms == AISAlarmsConfig()  # defaults: enabled, fail_on_alarm false
    assert cfg.ais_alarms.enabled and not cfg.ais_alarms.fail_on_alarm
    assert not validate_loss_config({}).ais_alarms.enabled  # absent section: off
    with pytest.raises(ValueError, match=r"loss_fn\.ais_alarms\.jump_factor=0\.5 is invalid"):
        validate_loss_config({"ais_alarms": {"jump_factor": 0.5}})
    with pytest.raises(ValueError, match=r"loss_fn\.ais_alarms\.bogus is not a known field"):
        validate_loss_config({"ais_alarms": {"bogus": 1}})
    with pytest.raises(ValueError, match=r"loss_fn\.ais_alarms\.fail_on_alarm='yes' is invalid"):
        AISClippedPGLossFn({"ais_alarms": {"fail_on_alarm": "yes"}})
    assert set(ALARM_METRIC_KEYS) == {f"ais_alarm/{k}" for k in ALARM_KINDS}
    assert set(ALARM_METRIC_KEYS) <= set(_loss().metric_normalizations)


def test_shipped_base_config_carries_the_section_at_its_defaults():
    import yaml

    from nemo_ais.nemo_rl.loss import _validate_section

    path = os.path.join(os.path.dirname(__file__), "../../configs/nemo_rl/grpo_ais_base.yaml")
    with open(path) as f:
        raw = yaml.safe_load(f)["loss_fn"]["ais_alarms"]
    assert raw == AISAlarmsConfig().model_dump()  # keys == fields, values == defaults
    assert _validate_section("ais_alarms", raw) == AISAlarmsConfig()


def test_a_resumed_run_with_alarms_off_keeps_the_history_in_its_next_checkpoint(one_rank_world, tmp_path, caplog):
    worker = _Worker({"train_global_batch_size": GBS})
    for step, sigma in enumerate(SIGMAS[:4], start=1):
        worker.train(_data(step, sigma), _loss(), gbs=GBS)
    first = str(tmp_path / "step_4" / "policy" / "weights")
    worker.save_checkpoint(first)
    resumed = _Worker({"train_global_batch_size": GBS}, weights_path=first)
    resumed.train(_data(5, 0.01), AISClippedPGLossFn({**BASE, "ais": {"mode": "ais"}}), gbs=GBS)  # alarms off
    assert resumed.ais_alarm_monitor is None
    second = str(tmp_path / "step_5" / "policy" / "weights")
    resumed.save_checkpoint(second)
    with open(ais_alarm_state_path(first)) as a, open(ais_alarm_state_path(second)) as b:
        assert json.load(b) == json.load(a)  # carried on, not dropped
    with caplog.at_level("WARNING", logger="nemo_ais.nemo_rl.workers.mixin"):
        _Worker({"train_global_batch_size": GBS}, weights_path=str(tmp_path / "upstream" / "weights"))
    assert "no AIS state beside" in caplog.text and "starts afresh" in caplog.text
