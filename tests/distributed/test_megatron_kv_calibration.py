# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""FP8 KV-scale calibration on a real megatron-core 0.16.1 GPTModel (CPU, gloo).

The model is ``GPTModel`` with the local (non-TE) layer spec, GQA (4 query heads, 2 KV
groups), q/k layernorm and RoPE, fp32 on CPU. Two test-only shims make its forward run
without CUDA (inside the spawned ranks only): ``torch.cuda.current_device`` returns
``"cpu"`` (RoPE moves ``inv_freq`` to it) and ``tensor_parallel.get_cuda_rng_tracker()``
returns a tracker whose ``fork()`` is a no-op (attention dropout is 0 here).

Oracle (independent of the hooks): a separate pre-hook on ``self_attention`` captures the
layer's input hidden states; the test recomputes Q/K/V itself in float64 -- ``linear_qkv``
weight, its own split of Megatron's ``[ng, (np/ng + 2) * hn]`` layout, its own LayerNorm
with the q/k-norm weights, its own RoPE -- and ``numpy.percentile`` (the ``element_percentile``
rule, run in every layout) or the max (NeMo-RL's default rule with few micro-batches, run
in the DP layout). The same oracle with RoPE or the k-norm left out gives a different K
scale (checked), so hooking the wrong place fails the test.

2 ranks, three layouts in one spawn: DP = 2 (different data per rank), TP = 2 (different
heads per rank) and PP = 2 (different layers per rank; stage 1 is fed hidden states
directly). Each checks: identical result dicts on both ranks, exactly ONE collective
(all_reduce MAX over WORLD, a [3, L, 3] float64 table) inside the calibration, and the
combined scales equal the max over ranks of each rank's single-process result.
"""

from __future__ import annotations

import contextlib
import math
import types
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _harness import MEGATRON_MARKS, count_collectives, run_distributed

from nemo_ais.megatron.kv_calibration import calibrate_qkv_fp8_scales
from nemo_ais.refit.kv_scales import kv_scale_names

pytestmark = MEGATRON_MARKS

LAYERS, HIDDEN, HEADS, GROUPS, VOCAB, SEQ, BATCH = 2, 32, 4, 2, 64, 8, 2
HEAD_DIM = HIDDEN // HEADS
PERCENTILE, MARGIN, E4M3_MAX, FLOOR = 97.5, 1.05, 448.0, 1e-4
ROPE_BASE = 10000.0
RTOL = 2e-5  # fp32 model vs float64 oracle


def _cpu_shims() -> None:
    warnings.filterwarnings("ignore")
    torch.cuda.current_device = lambda: "cpu"  # RoPE: inv_freq.to(current_device())
    import megatron.core.tensor_parallel as tp

    tracker = types.SimpleNamespace(fork=lambda *a, **k: contextlib.nullcontext())
    tp.get_cuda_rng_tracker = lambda *a, **k: tracker


def _gpt(tp: int, pp: int, pre_process: bool, post_process: bool):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_query_groups=GROUPS,
        qk_layernorm=True,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        pipeline_dtype=torch.float32,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
    )
    torch.manual_seed(1234)  # same master weights on every rank (TP splits them)
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=get_gpt_layer_local_spec(qk_layernorm=True),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        position_embedding_type="rope",
        rotary_base=int(ROPE_BASE),
        pre_process=pre_process,
        post_process=post_process,
    )
    with torch.no_grad():  # non-trivial q/k-norm affine parameters
        for name, p in model.named_parameters():
            if "q_layernorm" in name or "k_layernorm" in name:
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
    return model.eval()


def _batches(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2)]


def _forward(model, ids: torch.Tensor):
    pos = torch.arange(SEQ).expand(BATCH, SEQ)
    mask = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).triu(1)  # True = masked
    return model(ids, pos, mask)


# ---- float64 oracle -----------------------------------------------------------------------


def _rope(x: np.ndarray) -> np.ndarray:
    """Non-interleaved RoPE on [s, b, h, d] at positions 0..s-1."""
    d = x.shape[-1]
    inv = 1.0 / ROPE_BASE ** (np.arange(0, d, 2) / d)
    ang = np.arange(x.shape[0])[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=-1)[:, None, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rot = np.concatenate([-x2, x1], axis=-1)
    return x * np.cos(ang) + rot * np.sin(ang)


def _norm(x: np.ndarray, module) -> np.ndarray:
    y = F.layer_norm(
        torch.from_numpy(x), (x.shape[-1],), module.weight.detach().double(), module.bias.detach().double(), eps=1e-5
    )
    return y.numpy()


def _oracle_qkv(attn, h: torch.Tensor, rope=True, k_norm=True) -> dict[str, np.ndarray]:
    """Q/K/V of one attention layer from its input hidden states [s, b, H]."""
    lin = attn.linear_qkv
    w = lin.weight.detach().double().numpy()
    mixed = h.detach().double().numpy() @ w.T
    if getattr(lin, "bias", None) is not None:
        mixed = mixed + lin.bias.detach().double().numpy()
    ng = attn.num_query_groups_per_partition
    q_per_g = attn.num_attention_heads_per_partition // ng
    mixed = mixed.reshape(*mixed.shape[:2], ng, (q_per_g + 2) * HEAD_DIM)
    q = mixed[..., : q_per_g * HEAD_DIM].reshape(*mixed.shape[:2], ng * q_per_g, HEAD_DIM)
    k = mixed[..., q_per_g * HEAD_DIM : (q_per_g + 1) * HEAD_DIM]
    v = mixed[..., (q_per_g + 1) * HEAD_DIM :]
    q = _norm(q, attn.q_layernorm)
    k = _norm(k, attn.k_layernorm) if k_norm else k
    return {"q": _rope(q) if rope else q, "k": _rope(k) if rope else k, "v": v}


def _oracle_scales(attns, captured, percentile=PERCENTILE, **variant) -> dict[str, float]:
    out = {}
    for layer, attn in attns.items():
        names = kv_scale_names(layer)
        for kind in ("q", "k", "v"):
            amax = max(
                float(np.percentile(np.abs(_oracle_qkv(attn, h, **variant)[kind]), percentile)) for h in captured[layer]
            )
            out[names[kind]] = max(amax, FLOOR) * MARGIN / E4M3_MAX
    return out


def _capture_inputs(model) -> tuple[dict, dict, list]:
    """Global layer -> self_attention, and a pre-hook recording its hidden states."""
    from nemo_ais.megatron.kv_calibration import find_attention_layers

    attns = find_attention_layers(model)
    captured = {layer: [] for layer in attns}
    handles = []
    for layer, attn in attns.items():

        def hook(_m, args, kwargs, layer=layer):
            h = args[0] if args else kwargs["hidden_states"]
            captured[layer].append(h.detach().clone())

        handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
    return attns, captured, handles


# ---- one rank's body -----------------------------------------------------------------------


def _calibrate(model, run, group, reduction="element_percentile"):
    """Calibrate; return the result and the collectives made OUTSIDE the forward passes."""
    spans = []  # [start, end) call indices of the forward (TP collectives of the model)
    with count_collectives() as counter:

        def counted_run():
            start = len(counter.calls)
            run()
            spans.append((start, len(counter.calls)))

        result = calibrate_qkv_fp8_scales(
            model,
            counted_run,
            num_layers=LAYERS,
            percentile=PERCENTILE,
            margin=MARGIN,
            include_q=True,
            reduction=reduction,
            group=group,
        )
    calls = [
        {
            "name": c.name,
            "op": c.op,
            "shapes": c.shapes,
            "dtypes": [str(d) for d in c.dtypes],
            "world": c.group is None or dist.get_world_size(c.group) == dist.get_world_size(),
        }
        for i, c in enumerate(counter.calls)
        if not any(a <= i < b for a, b in spans)
    ]
    return result, calls


def _phase(tp: int, pp: int, seed: int) -> dict:
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, create_gloo_process_groups=False
    )
    try:
        first = parallel_state.is_pipeline_first_stage()
        last = parallel_state.is_pipeline_last_stage()
        model = _gpt(tp, pp, pre_process=first, post_process=last)
        batches = _batches(seed + parallel_state.get_data_parallel_rank())
        g = torch.Generator().manual_seed(seed)
        stage_inputs = [torch.randn(SEQ, BATCH, HIDDEN, generator=g) for _ in batches]

        def run():
            for ids, h in zip(batches, stage_inputs, strict=True):
                if not first:  # a later stage gets hidden states from the previous one
                    model.set_input_tensor(h)
                _forward(model, ids)

        attns, captured, handles = _capture_inputs(model)
        run()  # oracle inputs (deterministic: the calibration runs see the same ones)
        for h in handles:
            h.remove()
        out = {}
        if pp == 1:  # a single stage alone lacks the other stage's layers
            out["local"], _ = _calibrate(model, run, group=None)
        out["combined"], out["calls"] = _calibrate(model, run, group=dist.group.WORLD)
        if tp == pp == 1:  # NeMo-RL's rule: max |x| per micro-batch, max over the few
            out["default"], _ = _calibrate(model, run, dist.group.WORLD, "percentile_of_amax")
            out["oracle_max"] = _oracle_scales(attns, captured, percentile=100.0)
        if tp == 1:
            out["oracle"] = _oracle_scales(attns, captured)
            out["oracle_no_rope"] = _oracle_scales(attns, captured, rope=False)
            out["oracle_no_knorm"] = _oracle_scales(attns, captured, k_norm=False)
        out["layers_here"] = sorted(attns)
        return out
    finally:
        parallel_state.destroy_model_parallel()


def _main(rank: int, world_size: int) -> dict:
    _cpu_shims()
    return {"dp": _phase(tp=1, pp=1, seed=11), "tp": _phase(tp=2, pp=1, seed=22), "pp": _phase(tp=1, pp=2, seed=33)}


@pytest.fixture(scope="module")
def ranks():
    return run_distributed(_main, world_size=2, timeout=240)


def _assert_close(got: dict, want: dict, rtol: float = RTOL) -> None:
    assert list(got) == list(want)
    for name in want:
        assert math.isclose(got[name], want[name], rel_tol=rtol), (name, got[name], want[name])


def _expected_keys() -> list[str]:
    return [kv_scale_names(i)[k] for i in range(LAYERS) for k in ("q", "k", "v")]


@pytest.mark.parametrize("layout", ["dp", "tp", "pp"])
def test_one_max_all_reduce_and_identical_dicts(ranks, layout):
    results = [r[layout] for r in ranks]
    assert results[0]["combined"] == results[1]["combined"]  # exact, keys and floats
    for r in results:
        assert r["calls"] == [
            {
                "name": "all_reduce",
                "op": "RedOpType.MAX",
                "shapes": ((3, LAYERS, 3),),
                "dtypes": ["torch.float64"],
                "world": True,
            }
        ]
    res = results[0]["combined"]
    assert res["format"] == "fp8" and res["percentile"] == PERCENTILE and res["margin"] == MARGIN
    assert list(res["layers"]) == _expected_keys()


def test_dp_scales_equal_float64_oracle_of_captured_qkv(ranks):
    for r in ranks:
        dp = r["dp"]
        _assert_close(dp["local"]["layers"], dp["oracle"])
        # the oracle discriminates: K before RoPE / before k-norm has another scale
        for variant in ("oracle_no_rope", "oracle_no_knorm"):
            for i in range(LAYERS):
                k = kv_scale_names(i)["k"]
                assert abs(dp[variant][k] / dp["oracle"][k] - 1) > 1e-3, (variant, k)
    # the combine is the max over ranks of each rank's oracle
    want = {k: max(r["dp"]["oracle"][k] for r in ranks) for k in ranks[0]["dp"]["oracle"]}
    _assert_close(ranks[0]["dp"]["combined"]["layers"], want)
    assert ranks[0]["dp"]["local"] != ranks[1]["dp"]["local"]  # ranks saw different data
    # NeMo-RL's rule: the max over ranks and micro-batches of max |x|
    want = {k: max(r["dp"]["oracle_max"][k] for r in ranks) for k in want}
    assert ranks[0]["dp"]["default"] == ranks[1]["dp"]["default"]
    _assert_close(ranks[0]["dp"]["default"]["layers"], want)


def test_tp_ranks_see_different_heads_and_combine_by_max(ranks):
    local = [r["tp"]["local"]["layers"] for r in ranks]
    assert local[0] != local[1]
    want = {k: max(d[k] for d in local) for k in local[0]}
    assert ranks[0]["tp"]["combined"]["layers"] == want  # exact: MAX of float64 values


def test_pp_keys_are_global_and_stages_fill_each_other(ranks):
    assert [r["pp"]["layers_here"] for r in ranks] == [[0], [1]]
    combined = ranks[0]["pp"]["combined"]["layers"]
    for stage, r in enumerate(ranks):
        # each global layer's scales come from the one stage that holds it
        for kind in ("q", "k", "v"):
            name = kv_scale_names(stage)[kind]
            _assert_close({name: combined[name]}, {name: r["pp"]["oracle"][name]})
