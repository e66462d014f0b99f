# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The weighted clipped GRPO surrogate: the ONLY policy-gradient loss of the package.

Algorithm box (rho = pi_old / mu; r = pi_theta / pi_old; **[reconstruction]** marks our AIS
weight, the rest follows NeMo-RL v0.7.0's ``ClippedPGLossFn``):

0. bypass       (``bypass=True``) pi_old := mu, so rho = 1 and r = pi_theta / mu
1. validate     shapes / dtypes / devices at once (flagged in step 2's all-reduce when it
                communicates); values, mask and N_tok / N_seq with ONE fused host sync
2. diagnostics  ais / m2po / batch_normalize without precomputed diagnostics: statistics
                -> ONE all-reduce over ``group`` -> alpha, m2po's q*, w_bar
3. weight       w_hat_it = MODES[mode].weight(l_it)              (detached, 0 where m = 0)
                ais: w_hat = (1 - alpha) + alpha * min(rho, C)   **[reconstruction]**
                batch_normalize: w_hat / w_bar (global batch mean, from step 2)
4. surrogate    r_it = exp(clamp(log pi_theta - log pi_old, -L, L))
                GSPO: r_it := exp(clamp(sum_t m_it log r_it / n_i, -L, L)) (IS weight stays w_hat)
                clip_loss_it = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
                use_cispo: clip_loss_it = -A sg(clip(r, 1 - eps_low, 1 + eps_high)) log pi_theta
                dual clip (A < 0): clip_loss_it = min(clip_loss_it, -A c)
                disable_ppo_ratio: clip_loss_it = -A log pi_theta
                tbpo **[reconstruction]** of QaRL's TBPO (arXiv 2604.07853; no code):
                s_i = exp(clamp(mean_t log r_it, -L, L));
                A >= 0: max(-A s_i, -A clip(s_i, 1 - clip_low, 1 + clip_high));
                A < 0: -A clip(s_i, 1 - neg_clip_low, 1 + neg_clip_high); w_hat = min(rho_geo, C_s)
5. KL penalty   x = clamp(log pi_ref - log pi_theta_kl, +-kl_input_clamp_value), pi_theta_kl = kl_logprobs (NeMo-RL's
                curr_logprobs_unfiltered) or pi_theta; k1 = -x, k2 = x^2 / 2, k3 = exp(x) - 1 - x;
                kl_it = beta_kl * clamp(s_it * k(x), +-kl_output_clamp_value), not times w_hat;
                s_it = exp(log pi_theta_kl - sg(.)) (value 1, score-function gradient), or with
                use_on_policy_kl_approximation nan_to_num(exp(log pi_theta_kl - log mu))
6. reduce       L = sum_it c_it (w_hat clip_loss + kl) + mu_nll L_nll, c_it = m_it / N_tok (token level) or
                m_it / (n_i N_seq) (sequence level); N_* = global_valid_tokens / _seqs (None: this batch's; NeMo-RL
                main's placeholder 1 refused when the weight needs a global-batch statistic);
                VAPO: L_nll = sum -p_it log pi_theta / clamp_min(sum p_it, 1), p = m [reward > 0]
7. metrics      summable form (:mod:`nemo_ais.core.metrics`); ``rollout_metrics=True`` adds
                ``mismatch/*`` (:mod:`nemo_ais.core.mismatch`)

Steps 4-6 follow CleanRL's ``ppo.py`` (autograd forms the gradient; ``tests/hand_gradient.py`` derives it by hand) with
NeMo-RL's ``max`` / ``min`` / ``clamp`` / ``where``, so ties get upstream's gradient. Besides the AIS weight, the
departures from NeMo-RL (v0.7.0 and main) are numerical guards: the clamp L, no + 1e-8 in denominators,
clamp_min(count, 1) for the NLL count, a zero (not NaN) gradient where the on-policy KL weight overflows. alpha = 0 is
mode ``none``, alpha = 1 mode ``tis``; no valid token: loss 0, finite metrics.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nemo_ais.config import CorrectionConfig, PGLossConfig, require_config, surrogate_conflicts
from nemo_ais.core import metrics as ais_metrics_lib, validation
from nemo_ais.core.diagnostics import AISDiagnostics, AISState, compute_diagnostics
from nemo_ais.core.mismatch import mismatch_metrics
from nemo_ais.core.surrogate import SURROGATES, LossInputs, kl_penalty
from nemo_ais.core.validation import describe
from nemo_ais.core.weights import compute_dtype
from nemo_ais.modes import MODES


class LossOutput(NamedTuple):
    """``loss``: 0-dim tensor with grad; ``metrics``: name -> 0-dim detached tensor."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]


class _Counts(NamedTuple):
    """Host-side counts read by the fused check of step 1 (python floats)."""

    n_tok_local: float
    n_seq_local: float
    global_n_tok: float  # N_tok as given (0 when the global batch is empty)
    n_tok: float  # the token normaliser (1 if N_tok = 0: loss 0, not NaN)
    n_seq: float  # the sequence normaliser (likewise)
    clean: bool  # every input finite at every position: masking by multiplication is safe


_KL_INPUTS = ("reference_logprobs", "kl_logprobs")


def _check_structure(named: dict[str, torch.Tensor | None], mask, pg: PGLossConfig) -> dict:
    """Step 1a: types, shapes and devices (raises at once); returns the tensors step 1b checks."""
    prev = named["prev_logprobs"]
    validation.check_2d("prev_logprobs", prev)
    if pg.reference_policy_kl_penalty > 0 and named["reference_logprobs"] is None:
        raise ValueError(
            "reference_logprobs: got None, expected [B, T] log-probs because "
            f"reference_policy_kl_penalty={pg.reference_policy_kl_penalty} > 0"
        )
    kl_off = pg.reference_policy_kl_penalty == 0  # the KL inputs are not read
    named = {k: v for k, v in named.items() if not (k in _KL_INPUTS and (kl_off or v is None))}
    for name, t in named.items():
        validation.check_like(name, t, prev, "prev_logprobs")
    validation.check_mask(mask, prev, "prev_logprobs")
    return named


def _check_rewards(rewards, prev: torch.Tensor, pg: PGLossConfig) -> None:
    """Step 1a: with ``positive_example_nll_weight > 0``, rewards are a real ``[B]`` tensor."""
    if pg.positive_example_nll_weight == 0:
        return
    need = f"because positive_example_nll_weight={pg.positive_example_nll_weight} > 0"
    if not isinstance(rewards, torch.Tensor) or rewards.is_complex():
        raise TypeError(f"rewards: got {describe(rewards)}, expected a real [B] tensor {need}")
    if tuple(rewards.shape) != tuple(prev.shape[:1]):
        raise ValueError(
            f"rewards: got {describe(rewards)}, expected [{prev.shape[0]}] (one reward per row of prev_logprobs) {need}"
        )
    if rewards.device != prev.device:
        raise ValueError(f"rewards: got device {rewards.device}, expected {prev.device}")


def _check_advantages(advantages, prev: torch.Tensor) -> None:
    """Step 1a: advantages are a floating ``[B, T]`` or ``[B]`` tensor on prev's device."""
    if not isinstance(advantages, torch.Tensor) or not advantages.is_floating_point():
        raise TypeError(f"advantages: got {describe(advantages)}, expected a floating tensor [B, T] or [B]")
    shape = tuple(prev.shape)
    if tuple(advantages.shape) not in (shape, shape[:1]):
        raise ValueError(
            f"advantages: got {describe(advantages)}, expected {list(shape)} or "
            f"[{shape[0]}] (broadcast over T) like prev_logprobs"
        )
    if advantages.device != prev.device:
        raise ValueError(f"advantages: got device {advantages.device}, expected {prev.device}")


def _inputs(theta, old, rollout, ref, adv, m: torch.Tensor, kl_theta, on_policy_kl) -> LossInputs:
    """Step 1b: the differences the loss needs, upcast; only log pi_theta (and _kl) keep a graph.

    A, l and the coefficients are 0 where m = 0; log r and the KL input are not masked but finite there, so the clamps
    keep exp() finite and c = 0 removes them.
    """
    dtype = m.dtype
    theta = theta.to(dtype)
    kl_theta = theta if kl_theta is None else kl_theta.to(dtype)
    old, rollout, adv = (t.detach().to(dtype) for t in (old, rollout, adv))
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    log_q = log_kl_is = None
    if ref is not None:
        log_q = ref.detach().to(dtype) - kl_theta
        if on_policy_kl:
            log_kl_is = (kl_theta - rollout) * m
    return LossInputs(
        logp_theta=theta,
        log_r=theta - old,
        log_rho=torch.sub(old, rollout).mul_(m),
        log_q=log_q,
        log_kl_is=log_kl_is,
        adv=adv * m,
        m=m,
    )


def _given(value, name: str) -> torch.Tensor | float | None:
    """A global count as a tensor to read in the fused sync, or a python float."""
    validation.check_scalar_count(name, value)
    if isinstance(value, torch.Tensor):
        return value.detach()
    return None if value is None else float(value)


def _global_batch_need(config: CorrectionConfig) -> str | None:
    """Why the weight needs a statistic of the global batch (alpha, q*, w_norm); None: it does not."""
    field = MODES[config.mode].batch_field
    if field is not None:
        return f"loss_fn.ais.mode={config.mode!r} needs the global batch's {field} before the first loss call"
    if config.batch_normalize:
        return "loss_fn.ais.batch_normalize=True needs the global batch's mean weight w_norm before the first loss call"
    return None


def _check_values(named, mask, advantages, x: LossInputs, global_tok, global_seq, need: str | None) -> _Counts:
    """Step 1b: ONE fused host sync; the error paths name the input, count and first index.

    ``nan_to_num(v - v, nan=-1)`` is -1 where a term is NaN / inf: its sum counts bad terms anywhere (``clean=False``:
    zero them by ``where``), its masked sum those at valid positions (raise). ``need``: why the weight needs a
    global-batch statistic (refuses NeMo-RL main's placeholder count 1).
    """
    terms = [t.detach() for t in (x.log_r, x.log_rho, x.log_q, x.adv) if t is not None]
    v = terms[0] + terms[1]
    for t in terms[2:]:
        v.add_(t)
    bad = v.sub_(v).nan_to_num_(nan=-1.0)  # in place: v is ours
    n_tok_local = x.m.sum()
    checks = [bad.sum(), bad.mul_(x.m).sum(), n_tok_local, (x.m.sum(dim=-1) > 0).sum()]
    # masks not in {0, 1}: m (1 - m) is 0 exactly at 0 and 1, on the caller's values (a float64 mask cast to float32
    # rounds 1e-60 to 0; sums of m^2 and m round it away)
    wide = mask.is_floating_point() and mask.dtype != x.m.dtype
    flat = mask if wide else x.m
    checks.append(torch.count_nonzero(flat * (1 - flat)))
    given = [_given(global_tok, "global_valid_tokens"), _given(global_seq, "global_valid_seqs")]
    # one vector, one read; float32 holds every count exactly up to 2^24, a float64 input promotes it all to float64
    tensors = [g for g in given if isinstance(g, torch.Tensor)]
    values = torch.cat([c.reshape(1).to(x.m.device) for c in checks + tensors]).tolist()
    bad_any, bad_valid, n_tok_local, n_seq_local, n_bad_mask, *read = values
    read = iter(read)
    given = [next(read) if isinstance(g, torch.Tensor) else g for g in given]
    if bad_valid != 0 or n_bad_mask != 0:
        _raise_for_bad_values(named, mask, advantages)  # else: an overflow, not bad input
    global_n_tok = n_tok_local if given[0] is None else given[0]
    global_n_seq = n_seq_local if given[1] is None else given[1]
    validation.check_global_count("global_valid_tokens", global_n_tok, n_tok_local, "tokens", need)
    validation.check_global_count("global_valid_seqs", global_n_seq, n_seq_local, "sequences", need)
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


def _sanitised(curr, prev, rollout, ref, advantages, m: torch.Tensor, kl_curr, on_policy_kl) -> LossInputs:
    """Step 1b, slow path (NaN / inf at masked positions): zero masked values, then derive."""
    valid = m.bool()
    adv_valid = valid if advantages.dim() == 2 else valid.any(dim=-1)

    def clean(t, where=valid):  # keeps the graph (0 gradient where m = 0); _inputs detaches
        return None if t is None else torch.where(where, t.to(m.dtype), 0)

    curr, prev, rollout, ref, kl_curr = (clean(t) for t in (curr, prev, rollout, ref, kl_curr))
    return _inputs(curr, prev, rollout, ref, clean(advantages, adv_valid), m, kl_curr, on_policy_kl)


def _coefficients(m: torch.Tensor, counts: _Counts, token_level: bool) -> torch.Tensor:
    """Step 6: c_it = m / N_tok or m / (n_i N_seq), applied before the sum (no float32 overflow)."""
    if token_level:
        return m / counts.n_tok
    n_tok_seq = m.sum(dim=-1, keepdim=True)
    return m / (torch.where(n_tok_seq > 0, n_tok_seq, 1) * counts.n_seq)


def _positive_nll(x: LossInputs, rewards: torch.Tensor) -> torch.Tensor:
    """Step 6b: NeMo-RL's VAPO term, mean -log pi_theta over this call's rows with reward > 0 (0, not NaN, if none)."""
    positive = x.m * (rewards.detach() > 0).to(x.m.dtype).unsqueeze(-1)
    return -(x.logp_theta * positive).sum() / positive.sum().clamp_min(1)


def _full(value: float, like: torch.Tensor) -> torch.Tensor:
    """0-dim tensor of ``value`` in ``like``'s dtype and device (a fill: no host-to-device copy)."""
    return torch.full((), value, dtype=like.dtype, device=like.device)


def _dot(values: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """sum_it values_it c_it by ``torch.sum`` (cascade summation, more exact than ``torch.dot``)."""
    return (values * coef).sum()


@torch.no_grad()
def _metrics(loss, kl_metric, sur, w_hat, x, tok_coef, counts, diagnostics):
    """Step 7: summable metrics, 0-dim detached tensors (no host sync)."""
    out = {
        "loss": loss.detach(),
        "num_valid_samples": _full(counts.n_seq_local, x.m),
        "probs_ratio": _dot(sur.r, tok_coef),
        "probs_ratio_clamped": _dot(sur.r_clip, tok_coef),
        "kl_penalty": kl_metric,
        "sampling_importance_ratio": _dot(w_hat, tok_coef),
    }
    if diagnostics is not None:
        n_tok_local, global_n_tok = _full(counts.n_tok_local, x.m), _full(counts.global_n_tok, x.m)
        out.update(ais_metrics_lib.ais_metrics(diagnostics, n_tok_local, global_n_tok))
    return out


def clipped_pg_loss(
    curr_logprobs: torch.Tensor,
    prev_logprobs: torch.Tensor | None,
    generation_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: CorrectionConfig,
    *,
    pg: PGLossConfig | None = None,
    reference_logprobs: torch.Tensor | None = None,
    kl_logprobs: torch.Tensor | None = None,
    rewards: torch.Tensor | None = None,
    diagnostics: AISDiagnostics | None = None,
    group: torch.distributed.ProcessGroup | None = None,
    state: AISState | None = None,
    global_valid_tokens: torch.Tensor | float | None = None,
    global_valid_seqs: torch.Tensor | float | None = None,
    rollout_metrics: bool = False,
) -> LossOutput:
    """Clipped GRPO loss with the per-token correction weight of ``config.mode``.

    Args:
        curr_logprobs: ``[B, T]`` log pi_theta (with grad).
        prev_logprobs: ``[B, T]`` log pi_old, detached; ignored (may be None) with ``bypass``.
        generation_logprobs: ``[B, T]`` log mu (rollout engine), detached.
        advantages: ``[B, T]`` or ``[B]``, detached.
        mask: ``[B, T]`` bool or float in {0, 1}: token_mask x sample_mask.
        pg: clipped-surrogate knobs (None: ``PGLossConfig()``, no KL term).
        reference_logprobs: ``[B, T]`` log pi_ref, required when the KL penalty is > 0.
        kl_logprobs: ``[B, T]`` KL-term log pi_theta (NeMo-RL's ``curr_logprobs_unfiltered``); None: ``curr_logprobs``.
        rewards: ``[B]``, required when ``pg.positive_example_nll_weight > 0``.
        diagnostics: precomputed for the global batch; None: computed on this batch with ``group`` / ``state`` (one
            all-reduce) when the weight needs a global-batch value (alpha, m2po's q*, w_norm).
        group: data-parallel group for that computation (None: single process).
        state: EMA state of alpha for that computation.
        global_valid_tokens: N_tok (NeMo-RL's ``global_valid_toks``); None: this batch's count.
        global_valid_seqs: N_seq; None: this batch's sequences with a valid token.
        rollout_metrics: also return this call's ``mismatch/*`` metrics.

    Returns:
        ``LossOutput(loss, metrics)``: 0-dim float32 (float64 for float64 inputs) loss with
        grad; metrics as in :mod:`nemo_ais.core.metrics` (+ ``positive_nll_loss`` with VAPO).

    Raises:
        TypeError, ValueError: naming the tensor or argument, what arrived and what was expected (count and first
            index for bad values); with ``group`` one agreed ``ValueError`` on every rank. Also: normalisers NaN, inf
            or below this batch's count (placeholder 1 when the mode needs a global statistic); ``config`` / ``pg``
            of the wrong type; tbpo with ``disable_ppo_ratio``, ``use_cispo``, GSPO or a token-level loss; bad
            ``rewards`` with VAPO.
    """
    require_config(config, CorrectionConfig, "clipped_pg_loss(config)")
    require_config(pg, PGLossConfig, "clipped_pg_loss(pg)", optional=True)
    pg = pg if pg is not None else PGLossConfig()
    mode = MODES[config.mode]
    conflicts = surrogate_conflicts(config, pg)
    if conflicts:
        raise ValueError(conflicts[0])
    if config.bypass:  # pi_old := mu
        prev_logprobs = generation_logprobs
    named = {
        "curr_logprobs": curr_logprobs,
        "prev_logprobs": prev_logprobs,
        "generation_logprobs": generation_logprobs,
        "reference_logprobs": reference_logprobs,
        "kl_logprobs": kl_logprobs,
    }
    needs_batch = mode.needs_alpha or config.batch_normalize  # a global-batch value
    collective = needs_batch and diagnostics is None and group is not None
    input_error = None
    try:
        named = _check_structure(named, mask, pg)  # step 1a
        _check_advantages(advantages, prev_logprobs)
        _check_rewards(rewards, prev_logprobs, pg)
        logp_ref = named.get("reference_logprobs")
        logp_kl = named.get("kl_logprobs")  # None: curr_logprobs
        dtype = compute_dtype(
            *(t for t in (curr_logprobs, prev_logprobs, logp_ref, logp_kl) if t is not None), advantages
        )
        m = mask.to(dtype)
        on_policy_kl = logp_ref is not None and pg.use_on_policy_kl_approximation
        terms = (curr_logprobs, prev_logprobs, generation_logprobs, logp_ref, advantages, m)
        x = _inputs(*terms, logp_kl, on_policy_kl)  # step 1b
        need = _global_batch_need(config)
        counts = _check_values(named, mask, advantages, x, global_valid_tokens, global_valid_seqs, need)
    except (TypeError, ValueError) as err:
        if not collective:
            raise
        input_error = err  # step 2 joins the all-reduce flagged; every rank raises there
    if needs_batch and diagnostics is None:  # step 2, before any local raise
        diagnostics = compute_diagnostics(
            prev_logprobs, generation_logprobs, mask, config, group, state, input_error=input_error
        )
    if not counts.clean:
        x = _sanitised(*terms, logp_kl, on_policy_kl)
    # step 3, with alpha (ais) or q* (m2po) of the global batch
    batch_value = getattr(diagnostics, mode.batch_field) if mode.needs_alpha else None
    w_hat = mode.weight(prev_logprobs, generation_logprobs, m.bool(), config, batch_value).to(dtype)
    if config.batch_normalize:
        w_hat = w_hat / diagnostics.w_norm
    sur = SURROGATES[mode.surrogate](x, pg, config)  # step 4
    coef = _coefficients(m, counts, pg.token_level_loss)  # step 6
    loss = (sur.clip_loss * (w_hat * coef)).sum()
    kl_metric = _full(0, m)
    if logp_ref is not None:  # step 5
        kl_loss = (kl_penalty(x, pg, m) * (coef * pg.reference_policy_kl_penalty)).sum()
        loss = loss + kl_loss
        kl_metric = kl_loss.detach() / pg.reference_policy_kl_penalty
    nll = None
    if pg.positive_example_nll_weight > 0:  # VAPO: not weighted by w_hat, local count
        nll = _positive_nll(x, rewards)
        loss = loss + pg.positive_example_nll_weight * nll
    tok_coef = coef if pg.token_level_loss else _coefficients(m, counts, True)
    metrics = _metrics(loss, kl_metric, sur, w_hat, x, tok_coef, counts, diagnostics)  # step 7
    if nll is not None:
        metrics["positive_nll_loss"] = nll.detach()
    if rollout_metrics:
        clamp = config.log_ratio_clamp
        metrics.update(mismatch_metrics(x, sur, tok_coef, counts.n_tok_local, pg, clamp))  # 7b
    return LossOutput(loss, metrics)
