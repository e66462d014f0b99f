# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""``policy.warm_start.curriculum``: a first SFT stage on shorter chains (issue 26, item 5).

The 33-value chain is not learned from scratch (docs/benchmarks.md
``warm_start_curve_fp4_long``); the 99-token leg of the dose study starts from the 11-value
warm start and continues on 33-value chains. What must hold: the first stage is exactly
the warm start of the shorter-chain config (the same cache file as a preset that trains it),
the second stage starts from its bits, and no config without a curriculum changes its
cache key.
"""

from __future__ import annotations

import pytest
import torch

from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm
from nemo_ais.embedded.warmstart import (
    _cache_key,
    build_task,
    first_stage,
    load_warm_start,
    train_sft,
    warm_start,
    warm_start_path,
)

TINY = [
    "data.task=chain",
    "data.chain_length=3",
    "data.sft_alt_fraction=0.5",
    "policy.warm_start.batch_size=4",
    "data.eval_size=8",
    "policy.warm_start.num_threads=1",
]
STAGE = "policy.warm_start.curriculum={chain_length: 2, steps: 3}"


def _cfg(tmp_path, *extra):
    cache = f"policy.warm_start.cache_dir={tmp_path / 'cache'}"
    return resolve_arm(load_config(CONFIG_DIR / "quick.yaml", [*TINY, cache, *extra]), None)


def test_the_first_stage_is_the_shorter_chains_own_warm_start(tmp_path):
    cfg = _cfg(tmp_path, "policy.warm_start.steps=2", STAGE)
    plain = _cfg(tmp_path, "data.chain_length=2", "policy.warm_start.steps=3")
    first = first_stage(cfg)
    assert first.data == plain.data and first.policy == plain.policy
    assert warm_start_path(first) == warm_start_path(plain)  # one cache file for both
    assert warm_start_path(cfg) != warm_start_path(plain)
    assert first_stage(plain) is None


def test_the_second_stage_starts_from_the_first_stages_bits(tmp_path):
    cfg = _cfg(tmp_path, "policy.warm_start.steps=0", STAGE)
    model, _, _ = train_sft(cfg, build_task(cfg), progress=False)
    stage1 = load_warm_start(warm_start_path(first_stage(cfg)))  # trained and cached first
    assert stage1.keys() == model.state_dict().keys()
    for name, value in model.state_dict().items():
        assert torch.equal(value, stage1[name]), name

    more = _cfg(tmp_path, "policy.warm_start.steps=2", STAGE)
    path = warm_start(more, build_task(more), progress=False)  # reuses stage 1's file
    trained = load_warm_start(path)
    assert path == warm_start_path(more) and path != warm_start_path(first_stage(more))
    assert any(not torch.equal(trained[k], stage1[k]) for k in stage1)


def test_a_config_without_a_curriculum_keeps_its_cache_key(tmp_path):
    cfg = _cfg(tmp_path, "policy.warm_start.steps=2")
    assert "curriculum" not in _cache_key(cfg)["warm_start"]
    staged = _cfg(tmp_path, "policy.warm_start.steps=2", STAGE)
    assert _cache_key(staged)["warm_start"]["curriculum"] == {"chain_length": 2, "steps": 3}


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            ["data.task=addition", "data.sft_alt_fraction=0", STAGE],
            r"curriculum\.chain_length=2 is invalid: expected data\.task=chain \(got addition\)",
        ),
        (["policy.warm_start.curriculum={chain_length: 3, steps: 3}"], r"fewer values than data\.chain_length=3"),
        (
            ["policy.warm_start.curriculum={chain_length: 2, steps: 0}"],
            r"policy\.warm_start\.curriculum\.steps=0 is invalid",
        ),
        (["policy.warm_start.curriculum={chain_length: 2}"], r"policy\.warm_start\.curriculum\.steps"),
    ],
)
def test_a_bad_curriculum_is_named(tmp_path, extra, match):
    with pytest.raises(ValueError, match=match):
        _cfg(tmp_path, *extra)
