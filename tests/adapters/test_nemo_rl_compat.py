# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""``nemo_ais.nemo_rl.compat``: the one place that knows how v0.7.0 and main differ.

Runs against the session's NeMo-RL (``--nemo-rl``); each expectation is stated for both
versions (``per_version``), so the v0.7.0 and the main session each check their own.
"""

from __future__ import annotations

import pytest
from nemo_rl import package_info
from nemo_rl.algorithms.loss import interfaces
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
from nemo_rl_version import NEMO_RL, per_version

from nemo_ais.nemo_rl import compat

pytestmark = pytest.mark.nemo_rl


@pytest.fixture
def fresh_detect():
    compat.detect.cache_clear()
    yield
    compat.detect.cache_clear()


def test_detect_names_the_session_version(fresh_detect):
    found = compat.detect()
    assert found.name == NEMO_RL
    # main was not version-bumped: the string cannot tell the two apart
    assert found.version_string.startswith(per_version(v0_7_0="0.7.0", main="0.6.0"))
    assert compat.require_supported() == found


def test_an_unknown_nemo_rl_is_refused_naming_what_is_supported(fresh_detect, monkeypatch):
    if NEMO_RL == "v0.7.0":  # a later release without main's interfaces
        monkeypatch.setattr(package_info, "__version__", "0.8.0")
    else:  # main's interfaces half there
        monkeypatch.delattr(interfaces, "MetricNormalizer")
    with pytest.raises(compat.UnsupportedNeMoRLError, match="is not supported") as err:
        compat.require_supported()
    for supported in compat.SUPPORTED.values():
        assert supported in str(err.value)


def test_normalizer_is_upstreams_spelling():
    expected = per_version(
        v0_7_0=["tokens", "sequences", "none"],
        main=[
            getattr(interfaces, "MetricNormalizer", None) and interfaces.MetricNormalizer.TOKENS,
            getattr(interfaces, "MetricNormalizer", None) and interfaces.MetricNormalizer.SEQUENCES,
            getattr(interfaces, "MetricNormalizer", None) and interfaces.MetricNormalizer.NONE,
        ],
    )
    got = [compat.normalizer(k) for k in ("tokens", "sequences", "none")]
    assert got == expected
    assert all(a is b for a, b in zip(got, expected, strict=True))  # main compares with `is`
    with pytest.raises(ValueError, match="'loss'"):
        compat.normalizer("loss")


def test_loss_init_kwargs_reads_back_what_setup_passed():
    cfg = ClippedPGLossConfig()
    if NEMO_RL == "main":
        upstream = ClippedPGLossFn(cfg, use_fused_linear_logprobs=True)
    else:
        upstream = ClippedPGLossFn(cfg)
    assert compat.loss_init_kwargs(upstream) == per_version(v0_7_0={}, main={"use_fused_linear_logprobs": True})


def test_grpo_option_reads_dict_and_model_sections():
    class _Config:  # what MasterConfig.grpo is on v0.7.0 (a dict) / main (a pydantic model)
        def __init__(self):
            self.grpo = {"async_grpo": {"enabled": True, "max_trajectory_age_steps": 2}}

    assert compat.grpo_option(_Config(), "async_grpo")["max_trajectory_age_steps"] == 2
    assert compat.grpo_option(_Config(), "absent", "d") == "d"
    from nemo_rl.algorithms import grpo

    section = getattr(grpo, "AsyncGRPOConfig", None)
    if section is not None and hasattr(section, "model_validate"):  # main
        config = _Config()
        config.grpo = type("G", (), {"async_grpo": section.model_validate({"enabled": True})})()
        assert compat.grpo_option(config, "async_grpo")["enabled"] is True
    assert NEMO_RL == per_version(v0_7_0="v0.7.0", main="main")
    assert (section is not None and hasattr(section, "model_validate")) == (NEMO_RL == "main")


def test_training_context_enters_a_checkpointer_that_is_a_context_manager(tmp_path):
    from nemo_rl.utils.checkpoint import CheckpointManager
    from shipped_configs import CONFIG_DIR, launcher

    raw = launcher().load_config_dict(str(CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"), [])
    manager = CheckpointManager({**raw["checkpointing"], "checkpoint_dir": str(tmp_path)})
    ctx = compat.training_context(manager)
    assert (ctx is manager) == per_version(v0_7_0=False, main=True)
    with ctx:
        pass
