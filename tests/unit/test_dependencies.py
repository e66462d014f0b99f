# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The plain install and the test install pick the same transformers, the one NeMo-RL runs.

Issue 28, item 2: ``pip install -e .`` resolved transformers 5.24 (its renamed
``past_key_values`` argument prints a FutureWarning from every process of the embedded
run) and ``pip install -e ".[test]"`` then downgraded the venv to 5.8.1. The base
dependency is now ``[nemo-rl-cpu]``'s range, that of NeMo-RL v0.7.0's Megatron stack
(Megatron-Bridge: ``>=5.8.1,<5.9.0``): inside NeMo-RL's own base range (v0.7.0 and main,
read from the vendored pyprojects) and holding its newest release. Our decoding paths
warn nothing under the installed release (nothing is silenced).
"""

from __future__ import annotations

import logging
import re
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
from nemo_rl_sources import NEMO_RL_SOURCES
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# transformers releases from NeMo-RL's floor to well past its ceiling (PyPI, 2026-11)
RELEASES = [Version(v) for v in ("5.5.0", "5.6.0", "5.7.0", "5.8.0", "5.8.1", "5.9.0", "5.24.0")]


def _transformers(requirements: list[str]) -> Requirement:
    (req,) = [Requirement(r) for r in requirements if re.match(r"transformers\b", r)]
    return req


def _allowed(req: Requirement) -> list[Version]:
    return [v for v in RELEASES if v in req.specifier]


def test_the_plain_and_the_test_install_allow_the_same_transformers():
    base = _transformers(PYPROJECT["dependencies"])
    cpu = _transformers(PYPROJECT["optional-dependencies"]["nemo-rl-cpu"])
    assert str(base.specifier) == str(cpu.specifier) == "<5.9.0,>=5.8.1"
    assert _allowed(base) == [Version("5.8.1")]


@pytest.mark.parametrize("version", sorted(NEMO_RL_SOURCES))
def test_the_range_is_the_one_nemo_rl_runs(version):
    nemo_rl = tomllib.loads((NEMO_RL_SOURCES[version] / "pyproject.toml").read_text())["project"]
    ours = _allowed(_transformers(PYPROJECT["dependencies"]))
    theirs = _allowed(_transformers(nemo_rl["dependencies"]))
    assert set(ours) <= set(theirs) and max(ours) == max(theirs)  # the newest NeMo-RL allows


def test_our_kv_cache_decoding_warns_nothing_under_the_installed_transformers(caplog):
    from transformers import DynamicCache

    from nemo_ais.embedded.model import build_model, greedy_decode
    from nemo_ais.rollout.sampling import generate, score_responses

    model = build_model(
        vocab_size=16,
        max_seq_len=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        init_seed=0,
    ).eval()
    prompts = torch.randint(3, 16, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompts)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        greedy = greedy_decode(model, prompts, max_new_tokens=4, eos_token_id=2, pad_token_id=0)
        out = generate(
            model,
            prompts,
            mask,
            max_new_tokens=4,
            generator=torch.Generator().manual_seed(0),
            eos_token_id=2,
            past_key_values=DynamicCache(),
        )
        scored = score_responses(model, prompts, mask, out.response_ids, past_key_values=DynamicCache())
    assert greedy.shape == (2, 4) and scored.shape == out.response_ids.shape
    ours = [str(w.message) for w in caught if "transformers" in w.filename or "torch" in w.filename]
    assert not ours, ours
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("transformers")]
    assert not logged, logged
