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
                     values, mask and the global normalisers N_tok / N_seq with ONE fused
                     host sync (a count that is NaN, inf, or below this call's own count
                     is refused)
2. diagnostics       mode ais without precomputed diagnostics: statistics -> ONE all-reduce
                     over ``group`` -> alpha  (:func:`~nemo_ais.core.compute_diagnostics`)
3. weight            w_hat_it = WEIGHT_FNS[mode](l_it)                  (detached, 0 where m = 0)
                     ais: w_hat = (1 - alpha) + alpha * min(rho, C)     **[reconstruction]**
4. surrogate         r_it = exp(clamp(log pi_theta - log pi_old, -L, L))
                     clip_loss_it = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
                     dual clip (A < 0): clip_loss_it = min(clip_loss_it, -A c)
                     disable_ppo_ratio: clip_loss_it = -A log pi_theta
                     d clip_loss / d log pi_theta = -A r on the unclipped branch, else 0
5. KL penalty        x = clamp(log pi_ref - log pi_theta, +-kl_input_clamp_value)
                     k1 = -x, k2 = x^2 / 2, k3 = exp(x) - 1 - x
                     kl_it = beta_kl * clamp(s_it * k(x), +-kl_output_clamp_value),
                     s_it = exp(log pi_theta - sg(log pi_theta)) (value 1, carries the score-function
                     gradient), NOT multiplied by w_hat;
                     d kl / d log pi_theta = beta_kl * (k(x) - k'(x)), 0 where a clamp is active
6. reduce            L = sum_it c_it (w_hat clip_loss + kl),  dL/d log pi_theta = c (w_hat d clip + d kl)
                     token level:    c_it = m_it / N_tok
                     sequence level: c_it = m_it / (n_i N_seq)
                     N_* = global_valid_tokens / global_valid_seqs (None: this batch's count)
7. metrics           summable form (:mod:`nemo_ais.core.metrics`); optionally NeMo-RL's
                     rollout-mismatch metrics of the call (``rollout_metrics=True``)

Steps 4-6 form the gradient with the loss (no autograd graph over [B, T] intermediates);
the loss is returned through a one-node autograd function whose backward is one multiply.
The gradient is the one autograd would give for the formulas above (ties of max / min
included: on a tie both branches have the same derivative).

Because the gradient is linear in w_hat, alpha = 0 reproduces mode ``none`` and alpha = 1
mode ``tis`` (cap C, no floor) exactly, and grad L_ais = (1 - alpha) grad L_none +
alpha grad L_tis.

Degenerate input: B = 0, T = 0 or no valid token gives loss 0 (with a graph, zero
gradients) and finite metrics; masked positions never reach exp(), so -inf padding is safe.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig, require_config
from nemo_ais.core import metrics as ais_metrics_lib
from nemo_ais.core import validation
from nemo_ais.core.diagnostics import AISDiagnostics, AISState, compute_diagnostics
from nemo_ais.core.weights import WEIGHT_FNS, compute_dtype

__all__ = ["ROLLOUT_METRIC_KEYS", "LossOutput", "clipped_pg_loss"]

LOG_2 = math.log(2)

# NeMo-RL v0.7.0 ClippedPGLossFn's rollout-mismatch keys, emitted with rollout_metrics=True
ROLLOUT_METRIC_KEYS = (
    "token_mult_prob_error",
    "gen_kl_error",
    "policy_kl_error",
    "js_divergence_error",
    "approx_entropy",
    "probs_ratio_min",
    "probs_ratio_max",
    "probs_ratio_clamped_min",
    "probs_ratio_clamped_max",
)


class LossOutput(NamedTuple):
    """``loss``: 0-dim tensor with grad; ``metrics``: name -> 0-dim detached tensor."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]


class _Inputs(NamedTuple):
    """Step-1 inputs in the compute dtype, detached, every term 0 where m = 0."""

    logp_theta: torch.Tensor  # log pi_theta (values only; the gradient is formed explicitly)
    log_r: torch.Tensor  # log pi_theta - log pi_old
    log_rho: torch.Tensor  # l = log pi_old - log mu
    log_q: torch.Tensor | None  # log pi_ref - log pi_theta (KL on)
    adv: torch.Tensor  # [B, T]
    m: torch.Tensor  # float mask


class _Counts(NamedTuple):
    """Host-side counts read by the fused check of step 1 (python floats)."""

    n_tok_local: float
    n_seq_local: float
    global_n_tok: float  # N_tok as given (0 when the global batch is empty)
    n_tok: float  # the token normaliser (1 if N_tok = 0: loss 0, not NaN)
    n_seq: float  # the sequence normaliser (likewise)
    clean: bool  # every input finite at every position: masking by multiplication is safe


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


def _inputs(theta, old, rollout, ref, adv, m: torch.Tensor) -> _Inputs:
    """Step 1b: the differences the loss needs, upcast, detached, zeroed where m = 0."""
    dtype = m.dtype
    theta = theta.detach().to(dtype)
    old = old.detach().to(dtype)
    adv = adv.detach().to(dtype)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    return _Inputs(
        logp_theta=theta,
        log_r=torch.sub(theta, old).mul_(m),
        log_rho=torch.sub(old, rollout.detach().to(dtype)).mul_(m),
        log_q=None if ref is None else torch.sub(ref.detach().to(dtype), theta).mul_(m),
        adv=adv * m,
        m=m,
    )


def _given(value, name: str) -> torch.Tensor | float | None:
    """A global count as a tensor to read in the fused sync, or as a python float.

    Raises:
        ValueError / TypeError: not a scalar count (:func:`validation.check_scalar_count`).
    """
    validation.check_scalar_count(name, value)
    if isinstance(value, torch.Tensor):
        return value.detach()
    return None if value is None else float(value)


def _check_values(named, mask, advantages, x: _Inputs, global_tok, global_seq) -> _Counts:
    """Step 1b: ONE fused host sync; the error paths name the input, count and first index.

    ``bad = nan_to_num(v - v, nan=-1)`` with v the sum of the masked differences is -1
    where a term is NaN / inf (or overflows) and 0 elsewhere, with plain float ops:
    ``-sum(bad)`` counts such positions anywhere (masked garbage such as -inf padding
    then needs zeroing by ``where``: ``clean=False``), ``-sum(bad * m)`` at valid ones
    (then the exact per-tensor count names the input and raises). The mask is in {0, 1}
    iff 0 <= m <= 1 and sum m^2 = sum m (no temporary).
    """
    terms = [t for t in (x.log_r, x.log_rho, x.log_q, x.adv) if t is not None]
    v = terms[0] + terms[1]
    for t in terms[2:]:
        v.add_(t)
    bad = v.sub_(v).nan_to_num_(nan=-1.0)  # in place: v is ours
    n_tok_local = x.m.sum()
    checks = [bad.sum(), bad.mul_(x.m).sum(), n_tok_local, (x.m.sum(dim=-1) > 0).sum()]
    if x.m.numel() > 0:  # every m in {0, 1} iff 0 <= m <= 1 and sum m^2 = sum m (exact sums)
        flat = x.m.reshape(-1)
        checks += [*torch.aminmax(flat), torch.dot(flat, flat) - n_tok_local]
    given = [_given(global_tok, "global_valid_tokens"), _given(global_seq, "global_valid_seqs")]
    tensors = [g for g in given if isinstance(g, torch.Tensor)]
    # one vector by type promotion (float32 holds every count exactly up to 2^24; a
    # float64 input promotes it all to float64), one read
    values = torch.cat([c.reshape(1).to(x.m.device) for c in checks + tensors]).tolist()
    bad_any, bad_valid, n_tok_local, n_seq_local, *read = values
    m_min, m_max, m_excess = read[:3] if x.m.numel() > 0 else (0, 0, 0)
    read = read[3:] if x.m.numel() > 0 else read
    given = [read.pop(0) if isinstance(g, torch.Tensor) else g for g in given]
    if bad_valid != 0 or m_min < 0 or m_max > 1 or m_excess != 0:
        _raise_for_bad_values(named, mask, advantages)  # else: an overflow, not bad input
    global_n_tok = n_tok_local if given[0] is None else given[0]
    global_n_seq = n_seq_local if given[1] is None else given[1]
    validation.check_global_count("global_valid_tokens", global_n_tok, n_tok_local, "tokens")
    validation.check_global_count("global_valid_seqs", global_n_seq, n_seq_local, "sequences")
    return _Counts(
        n_tok_local=n_tok_local,
        n_seq_local=n_seq_local,
        global_n_tok=global_n_tok,
        n_tok=global_n_tok if global_n_tok > 0 else 1,
        n_seq=global_n_seq if global_n_seq > 0 else 1,
        clean=bad_any == 0,
    )


def _raise_for_bad_values(named, mask, advantages) -> None:
    """Step 1b, error path: exact counts per tensor; raise for the first bad one, if any."""
    valid = validation.valid_positions(mask)
    counts = validation.bad_value_counts(named, mask, valid)
    adv_valid = valid if advantages.dim() == valid.dim() else valid.any(dim=-1)
    bad_adv = (~torch.isfinite(advantages) & adv_valid).sum().to(counts.dtype)
    counts = torch.cat([counts, bad_adv.unsqueeze(0)]).tolist()
    if any(counts):
        tensors = {**named, "mask": mask, "advantages": advantages}
        validation.raise_for_bad_values(tensors, valid, counts)


def _sanitised(curr, prev, rollout, ref, advantages, m: torch.Tensor) -> _Inputs:
    """Step 1b, slow path (NaN / inf at masked positions): zero masked values, then derive."""
    valid = m.bool()
    adv_valid = valid if advantages.dim() == 2 else valid.any(dim=-1)

    def clean(t, where=valid):
        return None if t is None else torch.where(where, t.detach().to(m.dtype), 0)

    adv = clean(advantages, adv_valid)
    return _inputs(clean(curr), clean(prev), clean(rollout), clean(ref), adv, m)


class _Surrogate(NamedTuple):
    clip_loss: torch.Tensor
    d_clip_loss: torch.Tensor | None  # d clip_loss / d log pi_theta (None: no gradient)
    r: torch.Tensor
    r_clip: torch.Tensor


def _surrogate(x: _Inputs, pg: PGLossConfig, log_ratio_clamp: float, grad: bool) -> _Surrogate:
    """Step 4: per-token clipped surrogate ``[B, T]`` and its derivative in log pi_theta."""
    # -A x is computed as -(A x): the same float (negation is exact)
    if pg.disable_ppo_ratio:
        r = x.logp_theta
        r_clip = r
        clip_loss = torch.mul(x.adv, r).neg_()
        d_clip_loss = -x.adv
    else:
        log_r = x.log_r.clamp(min=-log_ratio_clamp, max=log_ratio_clamp)
        inside_clamp = (log_r == x.log_r) if grad else None
        r = log_r.exp_()  # in place: log_r is ours
        r_clip = r.clamp(min=1 - pg.ratio_clip_min, max=1 + pg.ratio_clip_max)
        loss_unclipped = torch.mul(x.adv, r).neg_()
        loss_clipped = torch.mul(x.adv, r_clip).neg_()
        d_clip_loss = None
        if grad:  # -A r where the unclipped branch is taken (on a tie the clipped one
            # agrees), 0 past the clip or the log-ratio clamp
            unclipped = inside_clamp.logical_and_(loss_unclipped >= loss_clipped)
        clip_loss = torch.maximum(loss_unclipped, loss_clipped, out=loss_clipped)
        if grad:
            d_clip_loss = loss_unclipped.mul_(unclipped)
    if pg.ratio_clip_c is not None:
        loss_dual = torch.mul(x.adv, pg.ratio_clip_c).neg_()
        dual = (x.adv < 0) & (loss_dual < clip_loss)
        clip_loss = torch.where(dual, loss_dual, clip_loss)
        d_clip_loss = torch.where(dual, 0, d_clip_loss) if grad else None
    return _Surrogate(clip_loss, d_clip_loss if grad else None, r, r_clip)


class _KLEstimator(NamedTuple):
    """k(x) and k'(x) of one estimator, given x and (k3 only) e = exp(x)."""

    value: Callable
    slope: Callable
    uses_exp: bool = False


_KL_ESTIMATORS = {
    "k1": _KLEstimator(lambda x, e: -x, lambda x, e: -1),
    "k2": _KLEstimator(lambda x, e: x.square() / 2, lambda x, e: x),
    "k3": _KLEstimator(lambda x, e: (e - 1).sub_(x), lambda x, e: e.sub_(1), uses_exp=True),
}


def _kl_estimate(kind: str, x: torch.Tensor) -> tuple[torch.Tensor, Callable]:
    """k(x) of estimator ``kind`` and a thunk for k'(x) (exp(x) computed once, k3 only)."""
    estimator = _KL_ESTIMATORS[kind]
    e = torch.exp(x) if estimator.uses_exp else None
    return estimator.value(x, e), lambda: estimator.slope(x, e)


class _KL(NamedTuple):
    kl_tok: torch.Tensor
    d_kl_tok: torch.Tensor | None


def _kl_penalty(x: _Inputs, pg: PGLossConfig, grad: bool) -> _KL:
    """Step 5: per-token KL(pi_theta || pi_ref) penalty ``[B, T]`` and its derivative."""
    log_q = x.log_q
    if pg.kl_input_clamp_value is not None:
        log_q = log_q.clamp(min=-pg.kl_input_clamp_value, max=pg.kl_input_clamp_value)
    k, slope = _kl_estimate(pg.reference_policy_kl_type, log_q)
    kl_tok = k
    if pg.kl_output_clamp_value is not None:
        kl_tok = k.clamp(min=-pg.kl_output_clamp_value, max=pg.kl_output_clamp_value)
    d_kl_tok = None
    if grad:
        # d/d theta [s k(x)] with s = 1, ds/d theta = 1, dx/d theta = -1: k - k'
        d_kl_tok = k - slope()  # k - k' (k3's slope reuses exp(x) in place: its last use)
        free = None  # where no clamp is active (a clamp passes no gradient)
        if log_q is not x.log_q:
            free = log_q == x.log_q
        if kl_tok is not k:
            free = kl_tok == k if free is None else free & (kl_tok == k)
        if free is not None:
            d_kl_tok.mul_(free)
        d_kl_tok.mul_(pg.reference_policy_kl_penalty)
    return _KL(kl_tok.mul_(pg.reference_policy_kl_penalty), d_kl_tok)


def _coefficients(m: torch.Tensor, counts: _Counts, token_level: bool) -> torch.Tensor:
    """Step 6: c_it with L = sum_it c_it loss_it: m / N_tok, or m / (n_i N_seq).

    Each term is divided by its normaliser BEFORE the sum: a float32 sum of large finite
    per-token terms (ratios near exp(log_ratio_clamp)) would overflow to inf even though
    the mean is finite.
    """
    if token_level:
        return m / counts.n_tok
    n_tok_seq = m.sum(dim=-1, keepdim=True)
    return m / (torch.where(n_tok_seq > 0, n_tok_seq, 1) * counts.n_seq)


def _full(value: float, like: torch.Tensor) -> torch.Tensor:
    """0-dim tensor of ``value`` in ``like``'s dtype and device (a fill: no host-to-device copy)."""
    return torch.full((), value, dtype=like.dtype, device=like.device)


def _dot(values: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """sum_it values_it c_it (c carries the mask and the normaliser).

    ``torch.sum`` (cascade summation, float32 error ~ eps log n), not ``torch.dot`` (whose
    float32 accumulation error grows ~ eps n / lanes: 3e-6 at n = 16384).
    """
    return (values * coef).sum()


def _dot_(values: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """:func:`_dot` of a temporary, scaled in place (``values`` is overwritten)."""
    return values.mul_(coef).sum()


class _LossWithGradient(torch.autograd.Function):
    """The loss value, with d loss / d log pi_theta formed in steps 4-6 (backward: one multiply)."""

    @staticmethod
    def forward(ctx, logp_theta, value, grad):
        ctx.save_for_backward(grad)
        ctx.grad_dtype = logp_theta.dtype
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return (grad_output * grad).to(ctx.grad_dtype), None, None


@torch.no_grad()
def _metrics(loss, kl_value, sur, w_hat, x, tok_coef, counts, diagnostics, pg):
    """Step 7: summable metrics, 0-dim detached tensors (no host sync)."""
    out = {
        "loss": loss.detach(),
        "num_valid_samples": _full(counts.n_seq_local, x.m),
        "probs_ratio": _dot(sur.r, tok_coef),
        "probs_ratio_clamped": _dot(sur.r_clip, tok_coef),
        "kl_penalty": kl_value / pg.reference_policy_kl_penalty
        if kl_value is not None
        else _full(0, x.m),
        "sampling_importance_ratio": _dot(w_hat, tok_coef),
    }
    if diagnostics is not None:
        n_tok_local, global_n_tok = _full(counts.n_tok_local, x.m), _full(counts.global_n_tok, x.m)
        out.update(ais_metrics_lib.ais_metrics(diagnostics, n_tok_local, global_n_tok))
    return out


@torch.no_grad()
def _rollout_metrics(x: _Inputs, sur: _Surrogate, tok_coef, counts, pg, log_ratio_clamp):
    """Step 7b: NeMo-RL's rollout-mismatch metrics of this call, in its summable form.

    token_mult_prob_error = mean_t exp(|l|), gen_kl_error = mean_t k(l) (KL(mu || pi_old)),
    policy_kl_error = mean_t k(-l), js_divergence_error = mean_t [softplus(l) - l / 2 - log 2]
    (= NeMo-RL's 0.5 KL(pi_old || M) + 0.5 KL(mu || M) with M the mixture, simplified),
    approx_entropy = -mean_t exp(log pi_theta - log mu) log pi_theta, and the min / max of
    r and of clip(r) over valid tokens (+-inf if there is none, as NeMo-RL).

    Unlike NeMo-RL, every exponent is clamped at ``log_ratio_clamp`` (``l`` to
    ``[-c, c]``, ``pi_theta / mu`` to ``<= e^c``), and each token's entropy term
    ``(pi_theta / mu) log pi_theta`` saturates at the dtype's largest finite value, so each
    metric is finite whenever the loss is (NeMo-RL's own values overflow float32 once
    ``|l| + |log r| > 88``, and the entropy term once ``e^c |log pi_theta|`` does); below
    the clamps the values are NeMo-RL's.
    """
    c = log_ratio_clamp
    estimator = _KL_ESTIMATORS[pg.reference_policy_kl_type]
    log_rho = x.log_rho.clamp(-c, c)
    exp_l, exp_neg_l = torch.exp(log_rho), torch.neg(log_rho).exp_()
    ratio = sur.r
    if pg.disable_ppo_ratio:  # r is log pi_theta then; the entropy wants the true ratio
        ratio = x.log_r.clamp(-c, c).exp_()
    theta_over_mu = torch.mul(ratio, exp_l).clamp_(max=math.exp(c))  # pi_theta / mu
    big = torch.finfo(theta_over_mu.dtype).max  # the entropy term's +-inf -> +-big
    js = torch.nn.functional.softplus(log_rho).sub_(log_rho, alpha=0.5).sub_(LOG_2)
    out = {  # each temporary is ours: scaled in place, then summed (_dot_)
        "gen_kl_error": _dot_(estimator.value(log_rho, exp_l), tok_coef),
        "policy_kl_error": _dot_(estimator.value(-log_rho, exp_neg_l), tok_coef),
        "js_divergence_error": _dot_(js, tok_coef),
        "approx_entropy": -_dot_(theta_over_mu.mul_(x.logp_theta).clamp_(-big, big), tok_coef),
        "token_mult_prob_error": _dot_(torch.maximum(exp_l, exp_neg_l, out=exp_l), tok_coef),
    }
    return {**out, **_ratio_extremes(sur, x.m, counts, pg)}


def _ratio_extremes(sur: _Surrogate, m: torch.Tensor, counts: _Counts, pg: PGLossConfig) -> dict:
    """Min / max of r and clip(r) over valid tokens; +inf / -inf if there is none."""
    if counts.n_tok_local == 0:
        inf = _full(math.inf, m)
        return dict(zip(ROLLOUT_METRIC_KEYS[5:], (inf, -inf, inf, -inf), strict=True))
    pad = torch.sub(1, m).mul_(torch.finfo(m.dtype).max)  # masked positions out of min / max
    r_valid = sur.r * m
    r_min, r_max = (r_valid + pad).min(), r_valid.sub_(pad).max()
    if pg.disable_ppo_ratio:
        r_clip_min, r_clip_max = r_min, r_max
    else:
        bounds = dict(min=1 - pg.ratio_clip_min, max=1 + pg.ratio_clip_max)
        r_clip_min, r_clip_max = r_min.clamp(**bounds), r_max.clamp(**bounds)
    return dict(zip(ROLLOUT_METRIC_KEYS[5:], (r_min, r_max, r_clip_min, r_clip_max), strict=True))


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
    rollout_metrics: bool = False,
) -> LossOutput:
    """Clipped GRPO loss with the per-token correction weight of ``config.mode``.

    Args:
        curr_logprobs: ``[B, T]`` log pi_theta of the sampled tokens (with grad), any float.
        prev_logprobs: ``[B, T]`` log pi_old (trainer, start of step); detached.
        generation_logprobs: ``[B, T]`` log mu (rollout engine); detached.
        advantages: ``[B, T]`` or ``[B]`` (broadcast over T); detached (data, as in NeMo-RL).
        mask: ``[B, T]`` bool or float in {0, 1}: token_mask x sample_mask.
        config: the ``loss_fn.ais`` section (mode and mixer constants).
        pg: clipped-surrogate knobs (None: ``PGLossConfig()`` defaults, no KL term).
        reference_logprobs: ``[B, T]`` log pi_ref, required when the KL penalty is > 0.
        diagnostics: precomputed for the global batch; None with mode ``ais`` computes them
            on this batch with ``group``/``state`` (one all-reduce). Other modes use them
            only for the ``ais/*`` metrics.
        group: data-parallel group for that computation (None: single process).
        state: EMA state of alpha for that computation.
        global_valid_tokens: token normaliser N_tok, a 0-dim tensor or number (None: this
            batch's valid tokens). NeMo-RL calls it ``global_valid_toks``.
        global_valid_seqs: sequence normaliser N_seq (None: this batch's sequences with a
            valid token).
        rollout_metrics: also return NeMo-RL's rollout-mismatch metrics of this call
            (:data:`ROLLOUT_METRIC_KEYS`, NeMo-RL's definitions and summable form), for the
            NeMo-RL adapter.

    Returns:
        ``LossOutput(loss, metrics)``: 0-dim float32 loss (float64 for float64 inputs) with
        grad; metrics as in :mod:`nemo_ais.core.metrics`. No valid token: loss 0, zero grads.

    Raises:
        TypeError, ValueError: the tensor's name, what arrived and what was expected; for
            NaN / inf / mask values the count and the first index. When step 2 runs the
            all-reduce over ``group``, a type / shape error of any rank is raised on every
            rank, as one agreed ``ValueError`` (see :func:`compute_diagnostics`).
        ValueError: ``global_valid_tokens`` / ``global_valid_seqs`` NaN, inf, or below this
            batch's own count (so <= 0 while it has a valid token), naming the argument.
            0 with no valid token anywhere is the empty global batch: loss 0.
        TypeError: ``config`` is not a :class:`CorrectionConfig` or ``pg`` not a
            :class:`PGLossConfig` (e.g. a dict), naming the parameter.
    """
    require_config(config, CorrectionConfig, "clipped_pg_loss(config)")
    require_config(pg, PGLossConfig, "clipped_pg_loss(pg)", optional=True)
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
    logp_ref = named.get("reference_logprobs")
    terms = (curr_logprobs, prev_logprobs, generation_logprobs, logp_ref, advantages)
    dtype = compute_dtype(
        *(t for t in (curr_logprobs, prev_logprobs, logp_ref) if t is not None), advantages
    )
    m = mask.to(dtype)
    x = _inputs(*terms, m)  # step 1b
    counts = _check_values(named, mask, advantages, x, global_valid_tokens, global_valid_seqs)
    if not counts.clean:
        x = _sanitised(*terms, m)
    grad = torch.is_grad_enabled() and curr_logprobs.requires_grad
    alpha = None if diagnostics is None else diagnostics.alpha
    valid = m.bool()
    w_hat = weight_fn.fn(prev_logprobs, generation_logprobs, valid, config, alpha).to(dtype)  # 3
    sur = _surrogate(x, pg, config.log_ratio_clamp, grad)  # step 4
    kl = None if logp_ref is None else _kl_penalty(x, pg, grad)  # step 5
    coef = _coefficients(m, counts, pg.token_level_loss)  # step 6
    kl_value = None if kl is None else _dot(kl.kl_tok, coef)
    loss_tok = w_hat * sur.clip_loss
    loss = (loss_tok if kl is None else loss_tok.add_(kl.kl_tok)).mul_(coef).sum()
    if grad:
        d_loss_tok = sur.d_clip_loss.mul_(w_hat)
        d_loss_tok = d_loss_tok if kl is None else d_loss_tok.add_(kl.d_kl_tok)
        loss = _LossWithGradient.apply(curr_logprobs, loss, d_loss_tok.mul_(coef))
    tok_coef = coef if pg.token_level_loss else _coefficients(m, counts, True)
    metrics = _metrics(loss, kl_value, sur, w_hat, x, tok_coef, counts, diagnostics, pg)  # step 7
    if rollout_metrics:
        metrics.update(_rollout_metrics(x, sur, tok_coef, counts, pg, config.log_ratio_clamp))
    return LossOutput(loss, metrics)
