# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The weighted clipped GRPO surrogate: the ONLY policy-gradient loss of the package.

Algorithm box (ratio rho = pi_old / mu; r = pi_theta / pi_old; **[reconstruction]** marks
our AIS weight, the rest follows NeMo-RL v0.7.0's ``ClippedPGLossFn``):

1. validate          shapes / dtypes / devices at once (if step 2 communicates, a failure
                     is flagged in its all-reduce instead, so every rank raises together);
                     values with one fused check
2. diagnostics       mode ais without precomputed diagnostics: statistics -> ONE all-reduce
                     over ``group`` -> alpha  (:func:`~nemo_ais.core.compute_diagnostics`)
3. weight            w_hat_it = WEIGHT_FNS[mode](l_it)                  (detached, 0 where m = 0)
                     ais: w_hat = (1 - alpha) + alpha * min(rho, C)     **[reconstruction]**
4. surrogate         r_it = exp(clamp(log pi_theta - log pi_old, -L, L))
                     clip_loss_it = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
                     dual clip (A < 0): clip_loss_it = min(clip_loss_it, -A c)
                     disable_ppo_ratio: clip_loss_it = -A log pi_theta
5. KL penalty        x = clamp(log pi_ref - log pi_theta, +-kl_input_clamp_value)
                     k1 = -x, k2 = x^2 / 2, k3 = exp(x) - 1 - x
                     kl_it = beta_kl * clamp(s_it * k(x), +-kl_output_clamp_value),
                     s_it = exp(log pi_theta - sg(log pi_theta)) (value 1, carries the score-function
                     gradient; detached where the input clamp is active), NOT multiplied by w_hat
6. reduce            token level:    L = sum_it (w_hat clip_loss + kl m) / N_tok
                     sequence level: L = sum_i [sum_t (w_hat clip_loss + kl m) / n_i] / N_seq
                     N_* = global_valid_tokens / global_valid_seqs (None: this batch's count)
7. metrics           summable form (:mod:`nemo_ais.core.metrics`)

Because the gradient is linear in w_hat, alpha = 0 reproduces mode ``none`` and alpha = 1
mode ``tis`` (cap C, no floor) exactly, and grad L_ais = (1 - alpha) grad L_none +
alpha grad L_tis.

Degenerate input: B = 0, T = 0 or no valid token gives loss 0 (with a graph, zero
gradients) and finite metrics; masked positions never reach exp(), so -inf padding is safe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig
from nemo_ais.core import metrics as ais_metrics_lib
from nemo_ais.core import validation
from nemo_ais.core.diagnostics import AISDiagnostics, AISState, compute_diagnostics
from nemo_ais.core.weights import WEIGHT_FNS, compute_dtype

__all__ = ["LossOutput", "clipped_pg_loss"]


class LossOutput(NamedTuple):
    """``loss``: 0-dim tensor with grad; ``metrics``: name -> 0-dim detached tensor."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]


class _Inputs(NamedTuple):
    """Validated, upcast, sanitised (0 at masked positions) inputs."""

    logp_theta: torch.Tensor
    logp_old: torch.Tensor
    logp_ref: torch.Tensor | None
    adv: torch.Tensor
    valid: torch.Tensor
    m: torch.Tensor


def _what(t: object) -> str:
    return validation.describe(t) if isinstance(t, torch.Tensor) else type(t).__name__


def _check_structure(named: dict[str, torch.Tensor | None], mask, pg: PGLossConfig) -> dict:
    """Step 1a: types, shapes and devices of the log-probs and mask (raises at once).

    Returns:
        The log-prob tensors whose values step 1b checks (reference only if the KL is on).
    """
    prev = named["prev_logprobs"]
    validation.check_2d("prev_logprobs", prev)
    if pg.reference_policy_kl_penalty > 0 and named["reference_logprobs"] is None:
        raise ValueError(
            "reference_logprobs: got None, expected [B, T] log-probs because "
            f"reference_policy_kl_penalty={pg.reference_policy_kl_penalty} > 0"
        )
    if pg.reference_policy_kl_penalty == 0:
        named = {k: v for k, v in named.items() if k != "reference_logprobs"}
    for name, t in named.items():
        validation.check_like(name, t, prev, "prev_logprobs")
    validation.check_mask(mask, prev, "prev_logprobs")
    return named


def _check_advantages(advantages, prev: torch.Tensor) -> None:
    """Step 1a: advantages are a floating ``[B, T]`` or ``[B]`` tensor on prev's device."""
    if not isinstance(advantages, torch.Tensor) or not advantages.is_floating_point():
        raise TypeError(
            f"advantages: got {_what(advantages)}, expected a floating tensor [B, T] or [B]"
        )
    shape = tuple(prev.shape)
    if tuple(advantages.shape) not in (shape, shape[:1]):
        raise ValueError(
            f"advantages: got {validation.describe(advantages)}, expected {list(shape)} or "
            f"[{shape[0]}] (broadcast over T) like prev_logprobs"
        )
    if advantages.device != prev.device:
        raise ValueError(f"advantages: got device {advantages.device}, expected {prev.device}")


def _check_values(named: dict[str, torch.Tensor], mask, advantages, valid) -> None:
    """Step 1b: ONE fused host sync; the error path names tensor, count and first index."""
    finite, mask_ok = validation.fast_check([*named.values(), advantages], mask, valid)
    if finite and mask_ok:
        return
    counts = validation.bad_value_counts(named, mask, valid)
    adv_valid = valid if advantages.dim() == valid.dim() else valid.any(dim=-1)
    bad_adv = (~torch.isfinite(advantages) & adv_valid).sum().to(counts.dtype)
    counts = torch.cat([counts, bad_adv.unsqueeze(0)]).tolist()
    if any(counts):
        tensors = {**named, "mask": mask, "advantages": advantages}
        validation.raise_for_bad_values(tensors, valid, counts)


def _prepare(curr_logprobs, prev_logprobs, reference_logprobs, advantages, valid) -> _Inputs:
    """Step 1c: upcast to float32 (float64 stays) and zero every masked position."""
    tensors = [t for t in (curr_logprobs, prev_logprobs, reference_logprobs) if t is not None]
    dtype = compute_dtype(*tensors, advantages)
    zero = torch.zeros((), dtype=dtype, device=valid.device)
    adv = advantages.to(dtype)
    adv = adv.unsqueeze(-1).expand_as(valid) if adv.dim() == 1 else adv

    def clean(t):
        return None if t is None else torch.where(valid, t.to(dtype), zero)

    return _Inputs(
        logp_theta=clean(curr_logprobs),
        logp_old=clean(prev_logprobs.detach()),
        logp_ref=clean(None if reference_logprobs is None else reference_logprobs.detach()),
        adv=torch.where(valid, adv, zero),
        valid=valid,
        m=valid.to(dtype),
    )


class _Surrogate(NamedTuple):
    clip_loss: torch.Tensor
    r: torch.Tensor
    r_clip: torch.Tensor


def _surrogate(x: _Inputs, pg: PGLossConfig, log_ratio_clamp: float) -> _Surrogate:
    """Step 4: per-token clipped surrogate ``[B, T]`` (with grad through logp_theta)."""
    if pg.disable_ppo_ratio:
        r = x.logp_theta
        r_clip = r
    else:
        log_r = (x.logp_theta - x.logp_old).clamp(min=-log_ratio_clamp, max=log_ratio_clamp)
        r = torch.exp(log_r)
        r_clip = r.clamp(min=1 - pg.ratio_clip_min, max=1 + pg.ratio_clip_max)
    loss_unclipped = -x.adv * r
    loss_clipped = -x.adv * r_clip
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    if pg.ratio_clip_c is not None:
        loss_dual = -x.adv * pg.ratio_clip_c
        clip_loss = torch.where(x.adv < 0, torch.minimum(clip_loss, loss_dual), clip_loss)
    return _Surrogate(clip_loss, r, r_clip)


_KL_ESTIMATORS = {
    "k1": lambda log_q: -log_q,
    "k2": lambda log_q: log_q.square() / 2,
    "k3": lambda log_q: torch.exp(log_q) - 1 - log_q,
}


def _kl_penalty(x: _Inputs, pg: PGLossConfig) -> torch.Tensor:
    """Step 5: per-token KL(pi_theta || pi_ref) penalty ``[B, T]``, NeMo-RL semantics."""
    log_q = x.logp_ref - x.logp_theta
    score = torch.exp(x.logp_theta - x.logp_theta.detach())
    if pg.kl_input_clamp_value is not None:
        log_q_c = log_q.clamp(min=-pg.kl_input_clamp_value, max=pg.kl_input_clamp_value)
        score = torch.where(log_q == log_q_c, score, score.detach())
        log_q = log_q_c
    kl_tok = score * _KL_ESTIMATORS[pg.reference_policy_kl_type](log_q)
    if pg.kl_output_clamp_value is not None:
        kl_tok = kl_tok.clamp(min=-pg.kl_output_clamp_value, max=pg.kl_output_clamp_value)
    return pg.reference_policy_kl_penalty * kl_tok * x.m


def _normaliser(value, default: torch.Tensor) -> torch.Tensor:
    """Global count as a tensor (None: ``default``); 0 is replaced by 1 (loss 0, not NaN)."""
    n = (
        default
        if value is None
        else torch.as_tensor(value, dtype=default.dtype, device=default.device)
    )
    return torch.where(n > 0, n, torch.ones((), dtype=n.dtype, device=n.device))


def _reduce(loss_tok: torch.Tensor, x: _Inputs, token_level: bool, n_tok, n_seq) -> torch.Tensor:
    """Step 6: token-level sum / N_tok, or sum of per-sequence means / N_seq.

    Each term is divided by its normaliser BEFORE the sum: a float32 sum of large finite
    per-token terms (ratios near exp(log_ratio_clamp)) would overflow to inf even though
    the mean is finite.
    """
    if token_level:
        return (loss_tok / n_tok).sum()
    n_tok_seq = x.m.sum(dim=-1, keepdim=True)
    loss_seq = (loss_tok / torch.where(n_tok_seq > 0, n_tok_seq, 1)).sum(dim=-1)
    return (loss_seq / n_seq).sum()


@torch.no_grad()
def _metrics(loss, kl_value, sur, w_hat, x, n_tok, diagnostics, global_valid_tokens, pg):
    """Step 7: summable metrics, 0-dim detached tensors (no host sync)."""
    n_tok_local = x.m.sum()
    n_seq_local = x.valid.any(dim=-1).sum().to(x.m.dtype)
    out = {
        "loss": loss.detach(),
        "num_valid_samples": n_seq_local,
        "probs_ratio": (sur.r * x.m).sum() / n_tok,
        "probs_ratio_clamped": (sur.r_clip * x.m).sum() / n_tok,
        "kl_penalty": kl_value / pg.reference_policy_kl_penalty
        if kl_value is not None
        else torch.zeros_like(n_tok),
        "sampling_importance_ratio": w_hat.sum() / n_tok,
    }
    if diagnostics is not None:
        global_n_tok = (
            n_tok_local
            if global_valid_tokens is None
            else torch.as_tensor(global_valid_tokens, dtype=n_tok.dtype, device=n_tok.device)
        )
        out.update(ais_metrics_lib.ais_metrics(diagnostics, n_tok_local, global_n_tok))
    return out


def clipped_pg_loss(
    curr_logprobs: torch.Tensor,
    prev_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: CorrectionConfig,
    *,
    pg: PGLossConfig | None = None,
    reference_logprobs: torch.Tensor | None = None,
    diagnostics: AISDiagnostics | None = None,
    group: torch.distributed.ProcessGroup | None = None,
    state: AISState | None = None,
    global_valid_tokens: torch.Tensor | float | None = None,
    global_valid_seqs: torch.Tensor | float | None = None,
) -> LossOutput:
    """Clipped GRPO loss with the per-token correction weight of ``config.mode``.

    Args:
        curr_logprobs: ``[B, T]`` log pi_theta of the sampled tokens (with grad), any float.
        prev_logprobs: ``[B, T]`` log pi_old (trainer, start of step); detached.
        generation_logprobs: ``[B, T]`` log mu (rollout engine); detached.
        advantages: ``[B, T]`` or ``[B]`` (broadcast over T).
        mask: ``[B, T]`` bool or float in {0, 1}: token_mask x sample_mask.
        config: the ``loss_fn.ais`` section (mode and mixer constants).
        pg: clipped-surrogate knobs (None: ``PGLossConfig()`` defaults, no KL term).
        reference_logprobs: ``[B, T]`` log pi_ref, required when the KL penalty is > 0.
        diagnostics: precomputed for the global batch; None with mode ``ais`` computes them
            on this batch with ``group``/``state`` (one all-reduce). Other modes use them
            only for the ``ais/*`` metrics.
        group: data-parallel group for that computation (None: single process).
        state: EMA state of alpha for that computation.
        global_valid_tokens: token normaliser N_tok (None: this batch's valid tokens).
        global_valid_seqs: sequence normaliser N_seq (None: this batch's sequences with a
            valid token).

    Returns:
        ``LossOutput(loss, metrics)``: 0-dim float32 loss (float64 for float64 inputs) with
        grad; metrics as in :mod:`nemo_ais.core.metrics`. No valid token: loss 0, zero grads.

    Raises:
        TypeError, ValueError: the tensor's name, what arrived and what was expected; for
            NaN / inf / mask values the count and the first index. When step 2 runs the
            all-reduce over ``group``, a type / shape error of any rank is raised on every
            rank, as one agreed ``ValueError`` (see :func:`compute_diagnostics`).
    """
    pg = pg if pg is not None else PGLossConfig()
    weight_fn = WEIGHT_FNS[config.mode]
    named = {
        "curr_logprobs": curr_logprobs,
        "prev_logprobs": prev_logprobs,
        "generation_logprobs": generation_logprobs,
        "reference_logprobs": reference_logprobs,
    }
    collective = weight_fn.needs_alpha and diagnostics is None and group is not None
    input_error = None
    try:
        named = _check_structure(named, mask, pg)  # step 1a
        _check_advantages(advantages, prev_logprobs)
    except (TypeError, ValueError) as err:
        if not collective:
            raise
        input_error = err  # step 2 joins the all-reduce flagged; every rank raises there
    if weight_fn.needs_alpha and diagnostics is None:  # step 2, before any local raise
        diagnostics = compute_diagnostics(
            prev_logprobs, generation_logprobs, mask, config, group, state, input_error=input_error
        )
    valid = validation.valid_positions(mask)
    _check_values(named, mask, advantages, valid)  # step 1b
    logp_ref = named.get("reference_logprobs")
    x = _prepare(curr_logprobs, prev_logprobs, logp_ref, advantages, valid)  # step 1c
    alpha = None if diagnostics is None else diagnostics.alpha
    w_hat = weight_fn.fn(prev_logprobs, generation_logprobs, valid, config, alpha)  # step 3
    sur = _surrogate(x, pg, config.log_ratio_clamp)  # step 4
    loss_tok = w_hat.to(x.m.dtype) * sur.clip_loss
    kl_tok = None if logp_ref is None else _kl_penalty(x, pg)  # step 5
    n_tok = _normaliser(global_valid_tokens, x.m.sum())
    n_seq = _normaliser(global_valid_seqs, x.valid.any(dim=-1).sum().to(x.m.dtype))
    loss_tok = loss_tok if kl_tok is None else loss_tok + kl_tok
    loss = _reduce(loss_tok, x, pg.token_level_loss, n_tok, n_seq)  # step 6
    kl_value = None if kl_tok is None else _reduce(kl_tok, x, pg.token_level_loss, n_tok, n_seq)
    metrics = _metrics(loss, kl_value, sur, w_hat, x, n_tok, diagnostics, global_valid_tokens, pg)
    return LossOutput(loss, metrics)  # step 7
