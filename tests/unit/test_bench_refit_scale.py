# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""benchmarks.bench_refit_scale feeds the refit stream a checkpoint's order.

Its first GPU run stopped at the warm-up: the state dict was emitted projection by
projection over all experts, so 128 experts' gate/up groups were open at once and the
stream refused it (max_open_groups). A checkpoint, and NeMo-RL's refit, go expert by
expert; this runs the benchmark's own stream calls on a small MoE layer on CPU.
"""

import pytest
import torch

from benchmarks.bench_refit_scale import build_layers, current_refit, named_tensors, stream_refit


def test_experts_come_expert_by_expert_with_gate_up_down_together():
    (layer,) = build_layers("qwen3-30b-a3b", 2, 1, torch.device("cpu"), experts=3, shrink=16)
    names = [name for name, _ in named_tensors([layer])]
    experts = [n.removeprefix("model.layers.0.mlp.experts.") for n in names if ".experts." in n]
    assert experts == [f"{e}.{proj}.weight" for e in range(3) for proj in ("gate_proj", "up_proj", "down_proj")]
    # the tensors are views of the stacks, in the same order
    stacked = dict(named_tensors([layer]))
    assert torch.equal(stacked["model.layers.0.mlp.experts.2.up_proj.weight"], layer.experts["up_proj"][2])


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4", "mxfp8"])
@pytest.mark.parametrize("num_experts", [None, 3])
def test_the_benchmarks_refits_run_on_a_moe_layer(fmt, num_experts):
    layers = build_layers("qwen3-30b-a3b", 2, 1, torch.device("cpu"), experts=3, shrink=16)
    stream_refit(fmt, layers, num_experts)  # raised ValueError (open groups) before the fix
    if num_experts is None:
        current_refit(fmt, layers)
