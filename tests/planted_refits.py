# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The model and the three refits the planted-refit-bug tests share.

A hidden-256 Qwen2 (a 2 x 2 grid of 128 x 128 FP8 weight tiles, so a transposed scale
layout moves scales), and three refits of its weights: as they are, a small drift, then
the K/V projections x 1.5 (the KV-cache scales move by a third).
"""

from __future__ import annotations

import torch
from tiny_models import tiny_lm


def tiny_qwen() -> torch.nn.Module:
    return tiny_lm(hidden_size=256, num_key_value_heads=4)


def three_refits(model) -> tuple[dict, dict, dict]:
    """Three refits' weights: the model's, a small drift, then K/V projections x 1.5."""
    sd1 = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(3)
    sd2 = {k: v + 1e-3 * torch.randn(v.shape, generator=g) for k, v in sd1.items()}
    sd3 = {k: v * 1.5 if ("k_proj" in k or "v_proj" in k) else v for k, v in sd2.items()}
    return sd1, sd2, sd3
