# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""QaRL's rollout-aligned trainer (``policy.rollout_aligned_quantization``).

The aligned trainer's log-probs of the rollout's tokens equal the twin's (fp8 + FP8 KV,
nvfp4_w4a4 + NVFP4 KV), where the plain trainer's differ by 1e-2 nats; the straight-through
gradient is the plain linear's gradient at the quantized operands; the aligned view shares
the policy's parameters; the config rules name their key.
"""

from __future__ import annotations

import typing

import pytest
import torch
import torch.nn.functional as F
from embedded_recipes import tiny_recipe
from torch import nn

from nemo_ais.config import CorrectionMode
from nemo_ais.embedded.aligned import RolloutAlignedPolicy, StraightThroughKVCache, StraightThroughLinear
from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm
from nemo_ais.embedded.model import response_logprobs
from nemo_ais.modes import MODES
from nemo_ais.refit.kv_scales import KVScales
from nemo_ais.rollout.fake_quant import LINEAR_FAKE_QUANT
from nemo_ais.rollout.kv_cache import QuantizedKVCache

ALIGNED = [("fp8", "fp8"), ("nvfp4_w4a4", "nvfp4")]


def _recipe(tmp_path, fmt, kv, aligned=True):
    extra = [f"rollout.format={fmt}", f"rollout.kv_cache={kv}"]
    extra.append(f"policy.rollout_aligned_quantization={str(aligned).lower()}")
    return tiny_recipe(tmp_path, *extra, arm="fp8-none")


@pytest.mark.parametrize(("fmt", "kv"), ALIGNED)
def test_aligned_trainer_logprobs_equal_the_twins(tmp_path, fmt, kv):
    r = _recipe(tmp_path, fmt, kv)
    batch = r._rollout(step=1)  # syncs and calibrates the twin, samples with it
    logp_old, _ = r._logprobs(batch.sequences, grad=False)
    m = batch.mask.bool()
    p = r.task.prompt_len
    prompts = batch.sequences[:, :p]
    scored = r.engine.score(prompts, torch.ones_like(prompts), batch.sequences[:, p:])
    # teacher-forced: the twin's forward, same shapes (observed bit-equal; 1e-6 leaves room
    # for a BLAS that blocks the lm_head GEMM by row count)
    torch.testing.assert_close(logp_old[m], scored[m], rtol=0, atol=1e-6)
    # against the decode loop's log-probs: its GEMMs see one token at a time, so the fp32
    # accumulation order differs (observed <= 5e-7). Where a pre-quantization value lies
    # within that of an E4M3 / E2M1 rounding boundary, the two paths pick neighbouring codes
    # and that token moves by ~1e-2 nats; which tokens do depends on the CPU's GEMM blocking
    # (2 of 62 on one 2-core Xeon, none on the machine it was written on). So: most tokens
    # agree to fp32 order, and the aligned trainer is far closer than the plain one.
    gap = (logp_old - batch.logp_rollout)[m].abs()
    assert float((gap <= 2e-6).float().mean()) >= 0.9, gap
    # the plain fp32 trainer is off by ~1e-2 nats per token: the test can tell
    with torch.no_grad():
        plain = response_logprobs(r.policy, batch.sequences, p)
    plain_gap = float((plain - batch.logp_rollout)[m].abs().mean())
    assert plain_gap > 5e-3
    assert float(gap.mean()) < 0.2 * plain_gap


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4_w4a4"])
def test_straight_through_gradient_is_the_linear_gradient_at_the_quantized_operands(fmt):
    """``dL/dW = g^T x_q`` and ``dL/dx = g W_q``: the plain linear's, at (x_q, W_q)."""
    gen = torch.Generator().manual_seed(0)
    linear = nn.Linear(256, 128, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(128, 256, generator=gen) * 0.05)
        linear.bias.copy_(torch.randn(128, generator=gen))
    fq = LINEAR_FAKE_QUANT[fmt]
    ste = StraightThroughLinear(linear, fq, "layer.weight")
    x = (torch.randn(3, 5, 256, generator=gen) * 2).requires_grad_(True)
    if fq.shared_weight_amax:
        ste.weight_amax = linear.weight.detach().abs().amax()
    if fq.static_input_amax:
        ste.input_amax = x.detach().abs().amax() * 0.5  # some inputs saturate
    g = torch.randn(3, 5, 128, generator=gen)
    ste(x).backward(g)
    # oracle: plain autograd of F.linear on leaf copies of the quantized operands
    w_q = fq.weight(linear.weight.detach(), amax=ste.weight_amax).requires_grad_(True)
    x_q = fq.activation(x.detach(), amax=ste.input_amax).float().requires_grad_(True)
    y = F.linear(x_q, w_q) + linear.bias.detach()
    y.backward(g)
    assert not torch.equal(w_q, linear.weight.detach()) and not torch.equal(x_q, x.detach())
    assert torch.equal(linear.weight.grad, w_q.grad)
    assert torch.equal(x.grad, x_q.grad)
    assert torch.equal(linear.bias.grad, g.sum((0, 1)))
    # the same in closed form: g^T x_q summed over tokens (fp32 sum order: 1e-5 relative)
    closed = g.reshape(-1, 128).T @ x_q.detach().reshape(-1, 256)
    torch.testing.assert_close(linear.weight.grad, closed, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["fp8", "nvfp4"])
def test_straight_through_kv_cache_writes_the_twins_values_and_passes_the_gradient(kind):
    gen = torch.Generator().manual_seed(1)
    scale = torch.tensor([[1.0, 0.01, 0.02]], dtype=torch.float64)
    scales = KVScales(scale * 448, scale, False)
    k = (torch.randn(2, 4, 7, 32, generator=gen) * 3).requires_grad_(True)
    v = (torch.randn(2, 4, 7, 32, generator=gen) * 3).requires_grad_(True)
    k_out, v_out = StraightThroughKVCache(kind, scales).update(k, v, 0)
    k_ref, v_ref = QuantizedKVCache(kind, scales).update(k.detach(), v.detach(), 0)
    assert torch.equal(k_out, k_ref) and torch.equal(v_out, v_ref)
    assert not torch.equal(k_ref, k.detach())
    gk, gv = torch.randn_like(k), torch.randn_like(v)
    torch.autograd.backward((k_out, v_out), (gk, gv))
    assert torch.equal(k.grad, gk) and torch.equal(v.grad, gv)


def test_aligned_view_shares_the_policy_parameters(tmp_path):
    r = _recipe(tmp_path, "nvfp4_w4a4", "nvfp4")
    view = r.trainer_forward
    assert isinstance(view, RolloutAlignedPolicy)
    assert [id(p) for p in view.parameters()] == [id(p) for p in r.policy.parameters()]
    assert list(view.model.state_dict()) == list(r.policy.state_dict())
    assert set(view.linears) == set(r.engine.quantized_module_names)
    # the policy itself stays unquantized (evaluation, checkpoints, refit)
    assert all(type(r.policy.get_submodule(n)) is nn.Linear for n in view.linears)
    batch = r._rollout(step=1)
    r.optimizer.zero_grad(set_to_none=True)
    r._logprobs(batch.sequences[:4], grad=True).sum().backward()
    grads = [p.grad for p in r.policy.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert float(r.policy.model.layers[0].self_attn.q_proj.weight.grad.abs().sum()) > 0


def test_plain_trainer_is_the_policy(tmp_path):
    r = _recipe(tmp_path, "fp8", "fp8", aligned=False)
    assert r.trainer_forward is r.policy


def test_aligned_before_calibration_is_refused(tmp_path):
    r = _recipe(tmp_path, "nvfp4_w4a4", "nvfp4")
    ids = torch.ones(2, 8, dtype=torch.long)
    r.engine.sync_weights(r.policy.state_dict())  # stale calibration, none given
    with pytest.raises(ValueError, match="static input amax is not calibrated"):
        r.trainer_forward(input_ids=ids)


def test_config_rules_name_the_key():
    base = ["policy.rollout_aligned_quantization=true"]
    with pytest.raises(ValueError, match=r"policy\.rollout_aligned_quantization.*compute_dtype"):
        load_config(CONFIG_DIR / "quick.yaml", [*base, "rollout.quantizer.compute_dtype=bfloat16"])
    with pytest.raises(ValueError, match=r"policy\.rollout_aligned_quantization"):
        load_config(CONFIG_DIR / "quick.yaml", ["policy.rollout_aligned_quantization=maybe"])
    # every arm, the BF16 one included (nothing quantized: the plain forward), validates
    raw = load_config(CONFIG_DIR / "fp4-quick.yaml", base)
    assert resolve_arm(raw, "bf16").policy.rollout_aligned_quantization
    qarl = resolve_arm(load_config(CONFIG_DIR / "fp4-quick.yaml"), "nvfp4_w4a4-qarl")
    assert qarl.policy.rollout_aligned_quantization and qarl.correction.mode == "tbpo"
    assert (qarl.rollout.format, qarl.rollout.kv_cache) == ("nvfp4_w4a4", "nvfp4")


def test_every_correction_mode_reports_an_applied_alpha():
    # the recipe reads the position between the uncorrected and the fully weighted gradient
    # from the mode's record: none 0, ais the diagnostics' alpha, every other mode 1
    assert set(MODES) == set(typing.get_args(CorrectionMode))
    diagnostics = {"alpha": 0.37}
    applied = {name: mode.applied_alpha(diagnostics) for name, mode in MODES.items()}
    assert applied == {name: {"none": 0.0, "ais": 0.37}.get(name, 1.0) for name in MODES}
