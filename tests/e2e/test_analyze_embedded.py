# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""``nemo-ais analyze`` of an embedded run's logs equals what that run logged in training.

``nemo-ais run`` writes each step's global batch as NeMo-RL's ``train_data_step{N}.jsonl``
(``<run_dir>/logs/<arm>_seed<seed>/``). Replaying them must give, step by step, the
``ais/*`` diagnostics and alpha (EMA carried across steps) that the recipe computed during
training and wrote to ``metrics.jsonl``; with two data-parallel ranks the logged batch is
the gathered global batch.
"""

import json
import math

import pytest

from nemo_ais.cli import main
from nemo_ais.core.metrics import AIS_METRIC_NAMES

pytestmark = pytest.mark.timeout(300)

TINY = [
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "rollout.prompts_per_chunk=2",
    "grpo.val_period=0",
    "data.eval_size=32",  # the quick preset's: its warm start is shared (tests/e2e/conftest.py)
    "policy.train_micro_batch_size=8",
    "experiment.include=[fp8-ais]",
    "experiment.seeds=[0]",
    "loss_fn.ais.ema=0.5",  # alpha's EMA state must be carried from step to step
    "logger.progress_bar=false",
    "logger.plots=false",
]
# Summation order differs (whole batch vs the prompt-padded [:, 1:] layout): float64 eps.
REL = 1e-12


@pytest.mark.parametrize(("dp", "steps"), [(1, 3), (2, 2)], ids=["dp1", "dp2"])
def test_analysis_equals_the_diagnostics_logged_in_training(tmp_path, cache_dir, dp, steps):
    argv = [
        "run",
        "--quick",
        f"logger.run_dir={tmp_path}",
        "logger.name=run",
        f"policy.warm_start.cache_dir={cache_dir}",
        f"cluster.dp_size={dp}",
        f"grpo.max_num_steps={steps}",
        *TINY,
    ]
    assert main(argv) == 0
    run_dir = tmp_path / "run"
    log_dir = run_dir / "logs" / "fp8-ais_seed0"
    assert sorted(p.name for p in log_dir.glob("*.jsonl")) == [
        "refit_readback.jsonl",  # the twin's refit readback, one row per step, all exact
        *(f"train_data_step{s}.jsonl" for s in range(1, steps + 1)),
    ]
    readback = (log_dir / "refit_readback.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in readback] == list(range(1, steps + 1))
    assert {json.loads(row)["weight_error"] for row in readback} == {0.0}
    first = json.loads((log_dir / "train_data_step1.jsonl").read_text().splitlines()[0])
    assert list(first) == [
        "content",
        "rewards",
        "input_lengths",
        "token_ids",
        "token_loss_mask",
        "sample_loss_mask",
        "advantages",
        "generation_logprobs",
        "prev_logprobs",
        "idx",
    ]
    out = tmp_path / "analysis"
    config = run_dir / "config.yaml"
    assert main(["analyze", str(log_dir), "--out", str(out), "--config", str(config)]) == 0
    rows = [json.loads(x) for x in (out / "analysis.jsonl").read_text().splitlines()]
    train = [
        json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if json.loads(x)["kind"] == "train"
    ]
    assert [r["step"] for r in rows] == [r["step"] for r in train] == list(range(1, steps + 1))
    assert rows[0]["ais/n_tok"] == train[0]["ais/n_tok"] > 0
    for got, want in zip(rows, train, strict=True):
        keys = [k for k in want if k.startswith("ais/")]
        # 18, issue 17: 5, issue 27: 3 (the tails)
        assert sorted(keys) == sorted(AIS_METRIC_NAMES) and len(keys) == 26
        for key in keys:
            assert math.isclose(got[key], want[key], rel_tol=REL, abs_tol=1e-15), (
                got["step"],
                key,
                got[key],
                want[key],
            )
    alphas = [r["ais/alpha"] for r in rows]
    assert any(a != r["ais/alpha_raw"] for a, r in zip(alphas[1:], rows[1:], strict=True))
    assert (out / "report.md").is_file()
