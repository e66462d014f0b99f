# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/bench_cpu_robust.py: the default run under this CPU and under emulated AVX2.

The full check (the shipped warm start and the bf16 arm, ~15 min) is a benchmark whose
result docs/benchmarks.md `cpu_robust` records; here the same code runs the default preset
on a tiny schedule in one process tree: the emulation must reach PyTorch (its capability
reads AVX2 and the warm start's bits change where this CPU has more than AVX2), and the
comparison must flag a number outside its declared tolerance.
"""

from concurrent.futures import ThreadPoolExecutor

import torch

from benchmarks.bench_cpu_robust import CHAIN_TOLERANCE, EMULATIONS, PRIMARY_TOLERANCE, compare, run_one

TINY = [
    "policy.warm_start.steps=6",
    "policy.warm_start.batch_size=16",
    "grpo.max_num_steps=2",
    "grpo.val_period=1",
    "grpo.num_prompts_per_step=4",
    "rollout.prompts_per_chunk=2",
    "cluster.dp_size=1",
    "grpo.num_generations_per_prompt=4",
    "data.eval_size=8",
    "experiment.seeds=[0]",
    "checkpointing.enabled=false",
    "logger.plots=false",
]


def test_the_emulated_cpu_reaches_pytorch_and_its_numbers_are_compared(tmp_path):
    # the two emulations side by side (each is mostly process start-up: ~12 s alone)
    with ThreadPoolExecutor(len(EMULATIONS)) as pool:
        runs = {
            name: pool.submit(run_one, "default", name.replace(" ", "-"), env, tmp_path, TINY)
            for name, env in EMULATIONS.items()
        }
        results = {name: run.result() for name, run in runs.items()}
    native, avx2 = results["this CPU"], results["AVX2"]
    # logger.plots=false skips the PNGs, not summary.md (the CLI's last line names it)
    assert (tmp_path / "default-this-CPU" / "summary.md").is_file()
    assert not list((tmp_path / "default-this-CPU").glob("*.png"))
    assert avx2["capability"] == "AVX2"
    a = torch.load(native["warm_start_file"], weights_only=False)["state_dict"]
    b = torch.load(avx2["warm_start_file"], weights_only=False)["state_dict"]
    same = all(torch.equal(a[k], b[k]) for k in a)
    # other kernels, other bits -- unless this CPU is itself an AVX2 machine
    assert same == (native["capability"] == "AVX2"), native["capability"]
    for r in results.values():
        assert 0.0 <= r["exact"] <= r["chains"] <= 1.0 and 0.0 <= r["primary"] <= 1.0
        assert list(r["per_seed"]) == [0] and r["arm"] == "bf16"
    table, _ = compare(results)
    assert table.count("\n| ") == 2 and "| this CPU |" in table and "| AVX2 | AVX2 |" in table


def _result(chains, primary):
    return {
        "capability": "X", "chains": chains, "exact": 0.0, "loss": 0.1, "primary": primary,
        "per_seed": {0: primary}, "wall": 1.0, "arm": "bf16",
    }  # fmt: skip


def test_a_number_outside_its_tolerance_fails_the_check():
    ref = _result(0.9, 0.4)
    assert compare({"a": ref, "b": _result(0.9 - CHAIN_TOLERANCE / 2, 0.4)})[1]
    assert compare({"a": ref, "b": _result(0.9, 0.4 + PRIMARY_TOLERANCE / 2)})[1]
    assert not compare({"a": ref, "b": _result(0.9 - 2 * CHAIN_TOLERANCE, 0.4)})[1]
    table, ok = compare({"a": ref, "b": _result(0.9, 0.4 - 2 * PRIMARY_TOLERANCE)})
    assert not ok and "**NO**" in table
