# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The keep-in-BF16 rule exists once: the twin, the refit stream, the vLLM refit patch and
the offline check agree on every layer, including a name a naive prefix match misjudges.

veRL #7519: an ignore pattern ``mlp.gate`` (the MoE router) also matched
``mlp.gate_up_proj`` (a fused MLP linear, as Phi-3 names it), so rollout ran in BF16 what
training treated as quantized. Here NeMo-RL's NVFP4 exclusion ``*mlp.gate`` plus attention
must keep the router, ``shared_expert_gate`` and q/o_proj in BF16 and quantize
``gate_up_proj`` and ``down_proj``, in all four places.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from nemo_ais.formats.registry import REFIT_FORMATS, get_format
from nemo_ais.nemo_rl import vllm_refit
from nemo_ais.preflight.checks.formats import kept_in_bf16
from nemo_ais.refit.stream import BlockSyncConfig, RefitConfig, RefitStream, plan_refit
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.modules import quantized_module_names
from nemo_ais.rules.keep_bf16 import KeepInBf16, module_name

N_LAYERS, K = 2, 32
LEAVES = (
    "self_attn.q_proj",
    "self_attn.o_proj",
    "mlp.gate",  # the MoE router
    "mlp.shared_expert_gate",  # the shared expert's router
    "mlp.gate_up_proj",  # a fused MLP linear: "mlp.gate" is a prefix of its name
    "mlp.down_proj",
)
# linears the refit cannot place (no projection vLLM's loader names; DeepSeek's MLA, a router
# nested one level down): kept BF16 by the twin and the stream, refused by the patch when the
# engine quantizes them; the offline check sees only the projections of a model's shapes
UNPLACED = ("self_attn.q_a_proj", "mlp.router.layer")
MODULES = [f"model.layers.{i}.{leaf}" for i in range(N_LAYERS) for leaf in LEAVES]
KEPT = {m for m in MODULES if m.endswith(("q_proj", "o_proj", "mlp.gate", "expert_gate"))}
UNPLACED_MODULES = [f"model.layers.{i}.{leaf}" for i in range(N_LAYERS) for leaf in UNPLACED]
IGNORE = ("*mlp.gate", "*self_attn*")  # NeMo-RL's NVFP4 default has both


def _twin_model() -> nn.Module:
    root = nn.Module()
    for name in MODULES + UNPLACED_MODULES:
        *path, leaf = name.split(".")
        parent = root
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, nn.Module())
            parent = getattr(parent, part)
        parent.add_module(leaf, nn.Linear(K, K, bias=False))
    root.config = SimpleNamespace(num_hidden_layers=N_LAYERS)
    return root


def _twin_kept(modules=MODULES) -> set[str]:
    config = RolloutPrecisionConfig(format="nvfp4_w4a16", attention_in_bf16=True)
    return set(modules) - set(quantized_module_names(_twin_model(), config))


def _stream_kept(modules=MODULES) -> set[str]:
    weights = [(f"{m}.weight", torch.empty(K, K, device="meta")) for m in modules]
    plan = plan_refit(weights, BlockSyncConfig(ignore=IGNORE))
    return {e.name.removesuffix(".weight") for e in plan.entries if e.action == "keep"}


def _patch_kept(modules=MODULES) -> set[str]:
    """The patch refuses a layer the engine holds in NVFP4 that the stream keeps in BF16."""
    kept = set()
    for m in modules:
        stream = RefitStream(BlockSyncConfig(ignore=IGNORE))
        pairs = [(f"{m}.weight", torch.ones(K, K))]
        try:
            list(vllm_refit.engine_pairs(pairs, lambda name: True, stream))
        except ValueError as err:
            assert "would keep it in BF16" in str(err), err
            kept.add(m)
    return kept


def _offline_kept() -> set[str]:
    cfg = {
        "policy": {
            "generation": {
                "real_quant": True,
                "quant_cfg": "examples/modelopt/quant_configs/nvfp4_a16.yaml",
                "real_quant_ignore": list(IGNORE),
            }
        }
    }
    keeps = kept_in_bf16(cfg, N_LAYERS)
    return {m for m in MODULES if keeps(m)}


@pytest.mark.parametrize("consumer", [_twin_kept, _stream_kept, _patch_kept, _offline_kept], ids=lambda f: f.__name__)
def test_every_consumer_keeps_exactly_the_same_layers(consumer):
    kept = consumer()
    assert kept == KEPT, f"kept {sorted(kept - KEPT)} wrongly, quantized {sorted(KEPT - kept)}"


@pytest.mark.parametrize("consumer", [_twin_kept, _stream_kept, _patch_kept], ids=lambda f: f.__name__)
def test_a_linear_the_refit_cannot_place_is_bf16_in_the_twin_and_the_stream_and_refused_by_the_patch(consumer):
    # once: the twin quantized every nn.Linear of a decoder layer, the stream only the named projections
    assert consumer(UNPLACED_MODULES) == set(UNPLACED_MODULES)


def test_a_prefix_is_not_a_match():
    rule = KeepInBf16(ignore=("*mlp.gate",), patterns=(r"mlp\.gate\b",))
    assert rule.reason("model.layers.0.mlp.gate") == "MoE router"
    assert rule.reason("model.layers.0.mlp.gate.weight") == "MoE router"
    assert rule.reason("model.layers.0.mlp.gate_up_proj.weight") is None
    assert rule.reason("model.layers.0.mlp.gate_proj") is None
    # a linear nested in the router (GraniteMoE, HunYuan); a part before the layer index is no router
    assert KeepInBf16().reason("model.layers.3.block_sparse_moe.router.layer.weight") == "MoE router"
    assert KeepInBf16().reason("model.layers.3.mlp.gate.wg") == "MoE router"
    assert KeepInBf16().reason("router.layers.3.mlp.up_proj") is None
    # NeMo-RL's keyword form IS a substring match (the engine does it): reported as such
    assert KeepInBf16(keywords=("mlp.gate",)).reason("model.layers.0.mlp.gate_up_proj") == (
        "ignored_layer_kws 'mlp.gate'"
    )


@pytest.mark.parametrize(
    ("fmt", "scale_name"), [*((f, None) for f in sorted(REFIT_FORMATS)), ("mxfp8", "weight_scale_from_checkpoint")]
)
def test_every_refit_tensor_of_a_linear_is_judged_as_its_module(fmt, scale_name):
    # A scale tensor the rule did not strip would be judged by its own last name part:
    # "mlp.gate.weight_scale_inv" is not a router and would be quantized (veRL #7519's class).
    config = RefitConfig(format=fmt, mxfp8_scale_name=scale_name)
    rule = KeepInBf16(num_layers=N_LAYERS, keywords=("shared_expert",))
    w = torch.randn(32, 64)
    for module in MODULES:
        amax = w.abs().amax().float() if fmt.startswith("nvfp4") else None
        scale = torch.ones((), dtype=torch.float32) if fmt == "nvfp4_w4a4" else None
        pairs = get_format(fmt).refit_pairs(f"{module}.weight", w, config, weight_amax=amax, input_scale=scale)
        assert len(pairs) >= 2
        for name, _ in pairs:
            assert module_name(name) == module, name
            assert rule.reason(name) == rule.reason(module), name


@pytest.mark.parametrize("fmt", REFIT_FORMATS)
@pytest.mark.parametrize("check", [True, False])
def test_the_engines_bf16_tensors_are_checked_as_the_streams_own(fmt, check):
    # check_finite is documented to refuse NaN/Inf in tensors kept in BF16; the refit hook
    # sent the ones the engine keeps (lm_head, embeddings, norms) without the check
    bad = torch.full((8, 8), float("nan"), dtype=torch.bfloat16)
    stream = RefitStream(RefitConfig(format=fmt, check_finite=check))
    pairs = [("lm_head.weight", bad)]
    if check:
        with pytest.raises(ValueError, match=r"lm_head\.weight: got 64 non-finite"):
            list(vllm_refit.engine_pairs(pairs, lambda name: False, stream))
        with pytest.raises(ValueError, match=r"lm_head\.weight: got 64 non-finite"):
            list(RefitStream(RefitConfig(format=fmt)).push(*pairs[0]))
    else:
        assert [n for n, _ in vllm_refit.engine_pairs(pairs, lambda name: False, stream)] == ["lm_head.weight"]
