# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The hand-derived gradient of the weighted clipped surrogate, vectorised: a test oracle.

Until issue 17 the core loss formed this gradient itself and returned it through a
one-node autograd function; the core now lets autograd differentiate the CleanRL-style
surrogate, and this module keeps the derivation as an independent check of it (float64,
ties included). Imports nothing from ``nemo_ais.core``; the per-token weight ``w_hat`` is
an input (``tests/oracles.py`` computes it).

d L / d log pi_theta,it = c_it (w_hat_it d clip_loss_it + d kl_it), with autograd's rule at
every kink: ``clamp`` passes the gradient on its closed interval (a value exactly at a
bound included); ``max`` / ``min`` split it in halves on a tie.

    log r = log pi_theta - log pi_old;  r = exp(clamp(log r, +-L))
    d (-A r)       = -A r  where |log r| <= L, else 0
    d (-A clip r)  = d (-A r) where 1 - eps_low <= r <= 1 + eps_high, else 0
    d max(a, b)    = d a (a > b), d b (b > a), (d a + d b) / 2 (tie)
    dual clip (A < 0): d min(clip_loss, -A c) = d clip_loss (<), 0 (>), half (tie)
    disable_ppo_ratio: d (-A log pi_theta) = -A
    KL: x = clamp(log pi_ref - log pi_theta, +-in), v = s k(x), s = 1 with s' = 1:
        d (beta clamp(v, +-out)) = beta (k(x) - k'(x)) where |x_raw| <= in and |v| <= out, else 0
    c_it = m / N_tok (token level) or m / (n_i N_seq)
"""

from __future__ import annotations

import torch


def _max_grad(a, b, da, db):
    return torch.where(a > b, da, torch.where(b > a, db, (da + db) / 2))


def surrogate_grad(theta, old, adv, m, pg, log_ratio_clamp):
    """(clip_loss, d clip_loss / d log pi_theta), ``[B, T]`` float64, 0 where m = 0."""
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    adv = adv * m
    if pg.disable_ppo_ratio:
        return -adv * theta * m, -adv.expand_as(theta) * m
    log_r = (theta - old) * m
    log_r_c = log_r.clamp(-log_ratio_clamp, log_ratio_clamp)
    r = log_r_c.exp()
    lo, hi = 1 - pg.ratio_clip_min, 1 + pg.ratio_clip_max
    r_clip = r.clamp(lo, hi)
    d1 = -adv * r * (log_r.abs() <= log_ratio_clamp)
    d2 = d1 * ((r >= lo) & (r <= hi))
    l1, l2 = -adv * r, -adv * r_clip
    loss = torch.maximum(l1, l2)
    d = _max_grad(l1, l2, d1, d2)
    if pg.ratio_clip_c is not None:
        l3 = -adv * pg.ratio_clip_c
        neg = adv < 0
        d_dual = torch.where(loss < l3, d, torch.where(l3 < loss, 0.0, d / 2))
        d = torch.where(neg, d_dual, d)
        loss = torch.where(neg, torch.minimum(loss, l3), loss)
    return loss, d


def kl_grad(theta, ref, m, pg):
    """(beta kl, d (beta kl) / d log pi_theta), ``[B, T]``."""
    x_raw = (ref - theta) * m
    x, free = x_raw, torch.ones_like(x_raw, dtype=torch.bool)
    if pg.kl_input_clamp_value is not None:
        x = x_raw.clamp(-pg.kl_input_clamp_value, pg.kl_input_clamp_value)
        free = x_raw.abs() <= pg.kl_input_clamp_value
    kind = pg.reference_policy_kl_type
    k = {"k1": lambda: -x, "k2": lambda: x * x / 2, "k3": lambda: x.exp() - 1 - x}[kind]()
    dk = {"k1": lambda: -torch.ones_like(x), "k2": lambda: x, "k3": lambda: x.exp() - 1}[kind]()
    v, d = k, torch.where(free, k - dk, 0.0)
    if pg.kl_output_clamp_value is not None:
        out = pg.kl_output_clamp_value
        d = torch.where(v.abs() <= out, d, 0.0)
        v = v.clamp(-out, out)
    beta = pg.reference_policy_kl_penalty
    return beta * v, beta * d


def coefficients(m, token_level, n_tok=None, n_seq=None):
    """c_it: m / N_tok, or m / (n_i N_seq) (None: this batch's count)."""
    n_i = m.sum(-1, keepdim=True)
    if token_level:
        n = m.sum() if n_tok is None else n_tok
        return m / (n if n > 0 else 1)
    n = (n_i > 0).sum() if n_seq is None else n_seq
    return m / (n_i.clamp(min=1) * (n if n > 0 else 1))


def loss_and_grad(theta, old, adv, m, w_hat, pg, log_ratio_clamp, ref=None, n_tok=None, n_seq=None):
    """(L, dL / d log pi_theta) of L = sum c (w_hat clip_loss + kl), by hand."""
    theta, old = theta.detach().double(), old.detach().double()
    clip_loss, d_clip = surrogate_grad(theta, old, adv.double(), m, pg, log_ratio_clamp)
    tok, d_tok = w_hat * clip_loss, w_hat * d_clip
    if pg.reference_policy_kl_penalty > 0:
        kl, d_kl = kl_grad(theta, ref.detach().double(), m, pg)
        tok, d_tok = tok + kl, d_tok + d_kl
    c = coefficients(m, pg.token_level_loss, n_tok, n_seq)
    return (tok * c).sum(), d_tok * c
