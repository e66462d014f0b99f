# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Float64 plain-loop oracles, re-derived from ais_method.md (docs/method.md).

Imports nothing from ``nemo_ais.core``: every formula is written again, one token at a
time, in Python floats. Inputs are nested lists (``tensor.tolist()``); ``mask`` holds
0/1. Ratio direction: rho = pi_old / mu, l = logp_old - logp_rollout.
"""

from __future__ import annotations

import math


def _valid(mask, i, t):
    return mask[i][t] == 1


def log_ratio(logp_old, logp_rollout, mask):
    """l_it = logp_old - logp_rollout at valid positions, 0 elsewhere."""
    return [
        [(logp_old[i][t] - logp_rollout[i][t]) if _valid(mask, i, t) else 0.0 for t in range(len(mask[i]))]
        for i in range(len(mask))
    ]


def weights(mode, logp_old, logp_rollout, mask, cfg, alpha=None):
    """Per-token weight w_hat of each mode; 0 at masked positions."""
    out = []
    for i in range(len(mask)):
        row = []
        ls = [logp_old[i][t] - logp_rollout[i][t] for t in range(len(mask[i])) if mask[i][t] == 1]
        geo = math.exp(sum(ls) / len(ls)) if ls else 1.0
        for t in range(len(mask[i])):
            if mask[i][t] != 1:
                row.append(0.0)
                continue
            ell = logp_old[i][t] - logp_rollout[i][t]
            rho = math.exp(min(ell, 700.0))
            if mode == "none":
                w = 1.0
            elif mode == "tis":
                floor = cfg.tis.floor if cfg.tis.floor is not None else 0.0
                w = min(max(rho, floor), cfg.weight_cap)
            elif mode == "icepop":
                w = rho if cfg.icepop.min <= rho <= cfg.icepop.max else 0.0
            elif mode == "seq_mask_geo":
                c = cfg.log_ratio_clamp
                rho_c = math.exp(min(max(ell, -c), c))
                w = rho_c if cfg.seq_mask_geo.min <= geo <= cfg.seq_mask_geo.max else 0.0
            elif mode == "ais":
                w = (1 - alpha) + alpha * min(rho, cfg.weight_cap)
            elif mode in ("seq_tis", "seq_mis"):
                s_i = sum(ls)  # log prod_t rho_t
                w = _capped_exp(s_i, cfg)
                if mode == "seq_mis" and not (cfg.seq_mis.min <= math.exp(min(s_i, 700.0)) <= cfg.seq_mis.max):
                    w = 0.0
            elif mode == "kl_rs":
                w = 1.0 if _kl_rs_kept(ls, cfg) else 0.0
            elif mode == "tbpo":  # min(rho_geo, C_seq), the geometric mean in log space
                g = sum(ls) / len(ls)
                w = _capped_exp(g, cfg)
            elif mode == "m2po":  # alpha carries the batch threshold q*
                c = cfg.log_ratio_clamp
                w = 1.0 if min(max(ell, -c), c) ** 2 < alpha else 0.0
            else:
                raise ValueError(mode)
            row.append(w)
        out.append(row)
    return out


def _capped_exp(log_w, cfg):
    """min(exp(log_w), C_seq), with exp's argument clamped below at -L."""
    if log_w >= math.log(cfg.seq_weight_cap):
        return cfg.seq_weight_cap
    return math.exp(max(log_w, -cfg.log_ratio_clamp))


def _kl_rs_kept(ls, cfg):
    """kl_rs: keep a sequence iff its statistic <= threshold and no token is vetoed."""
    c = cfg.log_ratio_clamp
    ks = []
    for ell in ls:
        lc = min(max(ell, -c), c)
        ks.append({"k1": -lc, "k2": lc * lc / 2, "k3": math.exp(lc) - 1 - lc}[cfg.kl_rs.estimator])
    if cfg.kl_rs.aggregation == "mean":
        stat = abs(sum(ks) / len(ks))
    else:
        stat = max(abs(k) for k in ks)
    veto = cfg.kl_rs.veto_min_ratio is not None and any(ell < math.log(cfg.kl_rs.veto_min_ratio) for ell in ls)
    return stat <= cfg.kl_rs.threshold and not veto


def m2po_bin(q):
    """Bin of q = l^2: 0 below 1e-6, then half-octaves (bin b >= 1: [1e-6 2^((b-1)/2), ...))."""
    if q < 1e-6:
        return 0
    return min(math.floor(2 * math.log2(q / 1e-6)) + 1, 63)


def m2po_threshold(qs, tau):
    """(q*, masked fraction) by whole bins from the top, as docs/method.md states it."""
    counts, sums = [0] * 64, [0.0] * 64
    for q in qs:
        counts[m2po_bin(q)] += 1
        sums[m2po_bin(q)] += q
    n, total = len(qs), math.fsum(qs)
    threshold = 1e4  # nothing masked
    for b in range(63, -1, -1):
        if n <= 0 or total <= tau * n:
            break
        if counts[b]:
            n, total = n - counts[b], total - sums[b]
            threshold = 0.0 if b == 0 else 1e-6 * 2 ** ((b - 1) / 2)
    return threshold, (len(qs) - n) / len(qs)


def m2po_exact_mask(qs, tau):
    """AReaL's rule, token by token: drop the largest q until the kept mean is <= tau."""
    order = sorted(range(len(qs)), key=lambda j: qs[j], reverse=True)
    kept = set(range(len(qs)))
    total = math.fsum(qs)
    for j in order:
        if not kept or total <= tau * len(kept):
            break
        kept.discard(j)
        total -= qs[j]
    return [j not in kept for j in range(len(qs))]


def diagnostics(logp_old, logp_rollout, mask, cfg, prev_alpha=None):
    """R, D, CV^2, k1, k3, gates and alpha over the whole batch (a dict of floats)."""
    c = cfg.log_ratio_clamp
    cap = cfg.weight_cap
    big_w = []
    toks = []
    for i in range(len(mask)):
        ls = [logp_old[i][t] - logp_rollout[i][t] for t in range(len(mask[i])) if mask[i][t] == 1]
        if not ls:
            continue
        lcs = [min(max(ell, -c), c) for ell in ls]
        log_w = sum(lcs) / len(lcs) if cfg.seq_weight == "geometric" else sum(lcs)
        big_w.append(math.exp(min(max(log_w, -c), c)))
        toks.extend(ls)
    n_tok = len(toks)
    if n_tok == 0:
        return dict(
            alpha=0.0,
            alpha_raw=0.0,
            g_sev=0.0,
            g_rel=1.0,
            g_var=1.0,
            ess_seq=1.0,
            severity=0.0,
            cv_w=0.0,
            cv2=0.0,
            kl_k1=0.0,
            kl_k3=0.0,
            w_mean=1.0,
            frac_capped=0.0,
            token_mult_prob_error=1.0,
            raw_ratio_mean=1.0,
            n_seq=0.0,
            n_tok=0.0,
            empty_batch=1.0,
            w_norm=1.0,
            m2po_threshold=1e4,
            mode_frac_masked=0.0,
            mode_frac_capped=0.0,
            mode_ess=1.0,
            abs_log_ratio_p999=0.0,
            abs_log_ratio_peak=0.0,
            seq_kl_peak=0.0,
        )
    n_seq = len(big_w)
    ess = min(1.0, sum(big_w) ** 2 / (n_seq * sum(w * w for w in big_w)))
    severity = sum(abs(ell) for ell in toks) / n_tok
    lcs = [min(max(ell, -c), c) for ell in toks]
    w = [min(math.exp(min(ell, 700.0)), cap) for ell in toks]  # the applied weight: raw l
    mean_w = math.fsum(w) / n_tok
    var_w = math.fsum((x - mean_w) ** 2 for x in w) / n_tok  # two-pass, no cancellation
    cv2 = var_w / (mean_w * mean_w)  # = (sum w^2 / n) / (sum w / n)^2 - 1
    g_sev = 1 - math.exp(-severity / cfg.severity_scale) if cfg.use_severity_gate else 1.0
    r_min = cfg.reliability_floor
    g_rel = min(1.0, max(0.0, (ess - r_min) / (1 - r_min))) if cfg.use_reliability_gate else 1.0
    g_var = 1 / (1 + cv2 / cfg.variance_tolerance) if cfg.use_variance_gate else 1.0
    alpha_raw = g_sev * g_rel * g_var if cfg.mixer == "product" else cfg.constant_alpha
    prev = alpha_raw if prev_alpha is None else prev_alpha
    alpha = cfg.ema * prev + (1 - cfg.ema) * alpha_raw
    alpha = min(cfg.alpha_max, max(cfg.alpha_min, alpha))
    return dict(
        alpha=alpha,
        alpha_raw=alpha_raw,
        g_sev=g_sev,
        g_rel=g_rel,
        g_var=g_var,
        ess_seq=ess,
        severity=severity,
        cv_w=math.sqrt(cv2),
        cv2=cv2,
        kl_k1=sum(-ell for ell in toks) / n_tok,
        kl_k3=sum(math.exp(lc) - 1 - lc for lc in lcs) / n_tok,
        w_mean=mean_w,
        frac_capped=sum(1 for ell in toks if math.exp(min(ell, 700.0)) > cap) / n_tok,
        token_mult_prob_error=sum(math.exp(abs(lc)) for lc in lcs) / n_tok,
        raw_ratio_mean=sum(math.exp(lc) for lc in lcs) / n_tok,
        n_seq=float(n_seq),
        n_tok=float(n_tok),
        empty_batch=0.0,
        **_batch_values(logp_old, logp_rollout, mask, cfg, alpha, mean_w, lcs),
        **_tails(logp_old, logp_rollout, mask, cfg),
    )


def tail_bin_edge(x):
    """Lower edge of x's tail bin: 0 below 2^-14, else the largest 2^-14 * 2^k <= x (k <= 22)."""
    if x < 2.0**-14:
        return 0.0
    edge = 2.0**-14
    for _ in range(22):
        if edge * 2 > x:
            break
        edge *= 2
    return edge


def _tails(logp_old, logp_rollout, mask, cfg):
    """p99.9 and max of |l| over valid tokens, max of the sequences' mean k3, as bin edges."""
    c = cfg.log_ratio_clamp
    abs_ls, k3s = [], []
    for i in range(len(mask)):
        ls = [logp_old[i][t] - logp_rollout[i][t] for t in range(len(mask[i])) if mask[i][t] == 1]
        if not ls:
            continue
        abs_ls.extend(abs(ell) for ell in ls)
        lcs = [min(max(ell, -c), c) for ell in ls]
        k3s.append(sum(math.expm1(lc) - lc for lc in lcs) / len(lcs))
    abs_ls.sort()
    rank = math.ceil(0.999 * len(abs_ls))  # the rank-th smallest (1-based)
    return dict(
        abs_log_ratio_p999=tail_bin_edge(abs_ls[rank - 1]),
        abs_log_ratio_peak=tail_bin_edge(abs_ls[-1]),
        seq_kl_peak=tail_bin_edge(max(k3s)),
    )


def _batch_values(logp_old, logp_rollout, mask, cfg, alpha, mean_w, lcs):
    """w_norm (batch_normalize), the m2po threshold and the mode_* values of the whole batch."""
    out = dict(w_norm=1.0, m2po_threshold=1e4, mode_frac_masked=0.0, mode_frac_capped=0.0)
    out["mode_ess"] = 1.0
    vals = []
    if cfg.mode not in ("ais", "m2po", "none"):
        w = weights(cfg.mode, logp_old, logp_rollout, mask, cfg)
        if cfg.mode in ("seq_tis", "seq_mis", "tbpo"):  # one weight per sequence
            rows = [(r, mr) for r, mr in zip(w, mask, strict=True) if 1 in mr]
            vals = [next(x for x, m in zip(r, mr, strict=True) if m == 1) for r, mr in rows]
        else:
            pairs = [zip(r, mr, strict=True) for r, mr in zip(w, mask, strict=True)]
            vals = [x for pair in pairs for x, m in pair if m == 1]
    if cfg.batch_normalize:
        if cfg.mode == "ais":
            out["w_norm"] = (1 - alpha) + alpha * mean_w
        else:
            w_norm = math.fsum(vals) / len(vals)
            out["w_norm"] = w_norm if w_norm > 0 else 1.0
    if cfg.mode in ("seq_tis", "seq_mis", "kl_rs", "tbpo"):
        n = len(vals)
        out["mode_frac_masked"] = sum(1 for x in vals if x == 0) / n
        if cfg.mode != "kl_rs":
            out["mode_frac_capped"] = sum(1 for x in vals if x >= cfg.seq_weight_cap) / n
        sq = math.fsum(x * x for x in vals)
        out["mode_ess"] = math.fsum(vals) ** 2 / (n * sq) if sq > 0 else 0.0
    if cfg.mode == "m2po":
        threshold, frac = m2po_threshold([lc * lc for lc in lcs], cfg.m2po.tau)
        out.update(m2po_threshold=threshold, mode_frac_masked=frac)
    return out


def _kl_token(theta, ref, pg):
    """(value, d value / d theta) of beta * clamp(s * k(x)), x = ref - theta, s = 1 in value."""
    x = ref - theta
    in_clamped = False
    if pg.kl_input_clamp_value is not None and abs(x) > pg.kl_input_clamp_value:
        x = math.copysign(pg.kl_input_clamp_value, x)
        in_clamped = True
    kind = pg.reference_policy_kl_type
    k = {"k1": -x, "k2": x * x / 2, "k3": math.exp(x) - 1 - x}[kind]
    dk_dx = {"k1": -1.0, "k2": x, "k3": math.exp(x) - 1}[kind]
    # d/dtheta [s * k]: s' = 1 (score function) unless the input clamp is active; x' = -1.
    grad = 0.0 if in_clamped else k - dk_dx
    out = pg.kl_output_clamp_value
    if out is not None and abs(k) > out:
        k = math.copysign(out, k)
        grad = 0.0
    beta = pg.reference_policy_kl_penalty
    return beta * k, beta * grad


def _surrogate_token(theta, old, adv, pg, log_clamp):
    """(clip_loss, d clip_loss / d theta) of the PPO/GRPO token surrogate."""
    if pg.disable_ppo_ratio:
        return -adv * theta, -adv
    lr = theta - old
    ellgrad = 1.0
    if abs(lr) > log_clamp:
        lr = math.copysign(log_clamp, lr)
        ellgrad = 0.0
    r = math.exp(lr)
    lo, hi = 1 - pg.ratio_clip_min, 1 + pg.ratio_clip_max
    r_clip = min(max(r, lo), hi)
    inside = lo <= r <= hi  # clamp passes the gradient on its closed interval
    l1, l2 = -adv * r, -adv * r_clip
    d1 = -adv * r * ellgrad
    d2 = d1 if inside else 0.0
    if l1 > l2:
        val, d = l1, d1
    elif l2 > l1:
        val, d = l2, d2
    else:  # a tie of max splits the gradient in halves
        val, d = l1, (d1 + d2) / 2
    if pg.ratio_clip_c is not None and adv < 0:
        l3 = -adv * pg.ratio_clip_c
        if l3 < val:
            val, d = l3, 0.0
        elif l3 == val:  # a tie of min splits it too
            d = d / 2
    return val, d


def _tbpo_band(s, adv, cfg):
    """(f, df/ds) of tbpo's per-token term at sequence ratio s (values a plain PPO would clip)."""
    if adv < 0:  # two-sided band: -A clip(s, 1 - nl, 1 + nh)
        lo, hi = 1 - cfg.tbpo.neg_clip_low, 1 + cfg.tbpo.neg_clip_high
        return -adv * min(max(s, lo), hi), (-adv if lo <= s <= hi else 0.0)
    lo, hi = 1 - cfg.tbpo.clip_low, 1 + cfg.tbpo.clip_high
    l1, l2 = -adv * s, -adv * min(max(s, lo), hi)
    d1, d2 = -adv, (-adv if lo <= s <= hi else 0.0)
    if l1 > l2:
        return l1, d1
    if l2 > l1:
        return l2, d2
    return l1, (d1 + d2) / 2  # a tie of max splits the gradient


def _tbpo_sequence(theta, old, advs, ws, coefs, cfg):
    """(loss, grad per token) of one sequence's tbpo terms sum_t c_t w_t f(s, A_t).

    s = exp(clamp(mean_t (theta_t - old_t), +-L)); d s / d theta_u = s / n inside the clamp.
    """
    n = len(theta)
    log_s = sum(a - b for a, b in zip(theta, old, strict=True)) / n
    inside = abs(log_s) <= cfg.log_ratio_clamp
    s = math.exp(min(max(log_s, -cfg.log_ratio_clamp), cfg.log_ratio_clamp))
    loss, d_log_s = 0.0, 0.0
    for a, w, c in zip(advs, ws, coefs, strict=True):
        f, df = _tbpo_band(s, a, cfg)
        loss += c * w * f
        d_log_s += c * w * df * s
    return loss, [d_log_s / n if inside else 0.0] * n


def pg_for(cfg, pg):
    """``pg`` as a test may pair it with ``cfg``: tbpo refuses a token-level loss (a mean over sequences)."""
    if cfg.mode == "tbpo" and pg.token_level_loss:
        return pg.model_copy(update={"token_level_loss": False})
    return pg


def clipped_pg_loss(
    logp_theta,
    logp_old,
    logp_rollout,
    adv,
    mask,
    cfg,
    pg,
    *,
    alpha=None,
    logp_ref=None,
    n_tok=None,
    n_seq=None,
    w_norm=1.0,
):
    """(loss, grad[B][T] w.r.t. logp_theta) of the weighted clipped surrogate (+ KL).

    ``alpha``: the mode's batch value (alpha for ais, q* for m2po); ``w_norm``: the
    batch_normalize divisor; bypass: pass logp_old = logp_rollout.
    """
    w = weights(cfg.mode, logp_old, logp_rollout, mask, cfg, alpha)
    w = [[x / w_norm for x in row] for row in w]
    n_tok_local = sum(1 for row in mask for m in row if m == 1)
    n_seq_local = sum(1 for row in mask if any(m == 1 for m in row))
    n_tok = n_tok_local if n_tok is None else n_tok
    n_seq = n_seq_local if n_seq is None else n_seq
    n_tok = n_tok if n_tok > 0 else 1
    n_seq = n_seq if n_seq > 0 else 1
    loss = 0.0
    grad = [[0.0] * len(row) for row in mask]
    for i in range(len(mask)):
        n_i = sum(1 for m in mask[i] if m == 1)
        denom = n_tok if pg.token_level_loss else n_seq * max(n_i, 1)
        a_i = adv[i]
        if cfg.mode == "tbpo" and n_i > 0:  # the sequence-ratio surrogate
            ts = [t for t in range(len(mask[i])) if mask[i][t] == 1]
            advs = [a_i[t] if isinstance(a_i, list) else a_i for t in ts]
            val, d = _tbpo_sequence(
                [logp_theta[i][t] for t in ts], [logp_old[i][t] for t in ts], advs,
                [w[i][t] for t in ts], [1 / denom] * n_i, cfg,
            )  # fmt: skip
            loss += val
            for t, dt in zip(ts, d, strict=True):
                grad[i][t] = dt
            if pg.reference_policy_kl_penalty > 0:
                for t in ts:
                    kv, kd = _kl_token(logp_theta[i][t], logp_ref[i][t], pg)
                    loss += kv / denom
                    grad[i][t] += kd / denom
            continue
        for t in range(len(mask[i])):
            if mask[i][t] != 1:
                continue
            a = a_i[t] if isinstance(a_i, list) else a_i
            val, d = _surrogate_token(logp_theta[i][t], logp_old[i][t], a, pg, cfg.log_ratio_clamp)
            tok, dtok = w[i][t] * val, w[i][t] * d
            if pg.reference_policy_kl_penalty > 0:
                kv, kd = _kl_token(logp_theta[i][t], logp_ref[i][t], pg)
                tok, dtok = tok + kv, dtok + kd
            loss += tok / denom
            grad[i][t] = dtok / denom
    return loss, grad


def random_batch(batch, length, *, scale=0.05, p_mask=0.2, seed=0, dtype=None):
    """Test data: dict of torch tensors (logp_old, logp_rollout, logp_theta, logp_ref, adv, mask).

    ``logp_rollout = logp_old + scale * noise`` (an FP8-like mismatch); masked positions
    of ``logp_rollout`` hold -inf to check that padding never leaks. Every row keeps at
    least one valid token unless ``p_mask >= 1``.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float64
    logp_old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 3 - 0.01
    logp_rollout = logp_old + scale * torch.randn(batch, length, generator=g, dtype=torch.float64)
    logp_theta = logp_old + 0.1 * torch.randn(batch, length, generator=g, dtype=torch.float64)
    logp_ref = logp_old + 0.2 * torch.randn(batch, length, generator=g, dtype=torch.float64)
    adv = torch.randn(batch, generator=g, dtype=torch.float64)
    mask = (torch.rand(batch, length, generator=g) >= p_mask).to(torch.float64)
    if p_mask < 1 and length > 0:
        mask[:, 0] = 1
    logp_rollout = torch.where(mask == 1, logp_rollout, -torch.inf)
    out = dict(
        logp_old=logp_old, logp_rollout=logp_rollout, logp_theta=logp_theta, logp_ref=logp_ref, adv=adv, mask=mask
    )
    return {k: v.to(dtype) if k != "mask" else v for k, v in out.items()}
