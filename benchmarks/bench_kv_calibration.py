# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""FP8 KV calibration rule vs rollout mismatch on the twin: NeMo-RL's rule or the element P99.9.

For each model (the two of ``bench_fp8_twin``: the warm-started embedded Qwen2 and a
random-init one), rollout format (``bf16`` linears, so the KV cache is the only error, and
``fp8``), KV cache (``fp8``, ``nvfp4``) and calibration rule
(:class:`~nemo_ais.refit.kv_scales.KVScaleConfig` ``reduction``):

1. Calibrate as NeMo-RL's GRPO does, trainer-side on the PREVIOUS step's rollouts (prompt
   + response, padding included, as upstream), one observation per micro-batch of 8
   sequences, observed on the fp32 model's K and V as its KV cache receives them, after RoPE
   (:meth:`~nemo_ais.refit.kv_scales.KVScaleCalibrator.install_hooks`).
2. Score THIS step's responses (sampled from the fp32 model, so every rule is measured
   on the same tokens) with the twin holding those scales, teacher-forced through its
   quantized KV cache, against the fp32 model's log-probs of the same tokens.

Reported, as NeMo-RL logs them: mean |delta logp|, ``token_mult_prob_error`` (mean
exp |delta|), ``gen_kl_error`` (k3), max |delta|, and the fraction of the K / V
elements the cache wrote with ``|x| > scale * 448`` (saturated by the E4M3 cast; for
NVFP4, above the static global amax). ``--steps`` consecutive steps (sample seeds) are
pooled.

    python -m benchmarks.bench_kv_calibration [--threads 1] [--steps 3] [--no-record]

The table goes to docs/low_precision.md (section ``kv_calibration``).
"""

from __future__ import annotations

import argparse

import torch
from transformers import DynamicCache

from benchmarks._record import record_section
from benchmarks.bench_fp8_twin import LOW_PRECISION_MD, embedded_setup, random_setup
from nemo_ais.refit.kv_scales import (
    KV_REDUCTIONS,
    KVSaturationCounter,
    KVScaleCalibrator,
    KVScaleConfig,
    KVScales,
)
from nemo_ais.rollout.twin import RolloutPrecisionConfig, RolloutTwin, generate, logprob_mismatch, score_responses

MICRO_BATCH = 8
FORMATS = ("bf16", "fp8")
KV_CACHES = ("fp8", "nvfp4")
RULE_LABEL = {
    "percentile_of_amax": "NeMo-RL (max per micro-batch, nearest-rank P99.9 over them)",
    "element_percentile": "element P99.9 per micro-batch, max over them",
}


def rollout(setup: dict, seed: int) -> dict:
    """One step's rollouts from the fp32 model: responses, full sequences and their mask."""
    model, ids, mask = setup["model"], setup["ids"], setup["mask"]
    out = generate(
        model,
        ids,
        mask,
        max_new_tokens=setup["max_new_tokens"],
        generator=torch.Generator().manual_seed(seed),
        eos_token_id=setup["eos"],
        pad_token_id=setup["pad"],
    )
    full_mask = torch.cat([mask, out.response_mask.to(mask.dtype)], dim=1)
    return {"response_ids": out.response_ids, "sequences": out.sequences, "full_mask": full_mask}


@torch.no_grad()
def trainer_side_scales(model, previous: dict, reduction: str, num_layers: int) -> KVScales:
    """NeMo-RL's recalibration after a step: the previous rollouts, micro-batches of 8."""
    calibrator = KVScaleCalibrator(num_layers, KVScaleConfig(reduction=reduction, include_q=False))
    with calibrator.install_hooks(model):
        for ids, mask in zip(
            previous["sequences"].split(MICRO_BATCH), previous["full_mask"].split(MICRO_BATCH), strict=True
        ):
            pos = (mask.cumsum(-1) - 1).clamp_min(0)
            model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1)
    return calibrator.compute_scales()


class _SaturationCache(DynamicCache):
    """HF's cache, counting the K / V it is handed (after RoPE: what the twin's cache quantizes) at valid positions."""

    def __init__(self, counter: KVSaturationCounter, valid: torch.Tensor) -> None:
        super().__init__()
        self.counter, self.valid = counter, valid

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        rows = self.valid[:, : key_states.shape[2]]
        for kind, states in (("k", key_states), ("v", value_states)):
            self.counter.observe(layer_idx, kind, states.transpose(1, 2)[rows])
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


@torch.no_grad()
def count_saturated(model, ids, mask, current: dict, scales: KVScales) -> KVSaturationCounter:
    """The K / V elements of this step's tokens (the fp32 model's, after RoPE, at valid positions) with
    ``|x| > scale * 448``."""
    counter = KVSaturationCounter(scales)
    cache = _SaturationCache(counter, current["full_mask"].bool())
    score_responses(model, ids, mask, current["response_ids"], past_key_values=cache)
    return counter


def measure(setup: dict, fmt: str, kv: str, reduction: str, steps: int) -> dict:
    model, ids, mask = setup["model"], setup["ids"], setup["mask"]
    twin = RolloutTwin(model, RolloutPrecisionConfig(format=fmt, kv_cache=kv))
    prev, gen, masks, saturated = [], [], [], []
    for step in range(steps):
        twin.kv_scales = trainer_side_scales(model, setup["rollouts"][step], reduction, twin.num_layers)
        current = setup["rollouts"][step + 1]
        gen.append(twin.score(ids, mask, current["response_ids"]))
        prev.append(score_responses(model, ids, mask, current["response_ids"]))
        masks.append(current["full_mask"][:, ids.shape[1] :])
        saturated.append(count_saturated(model, ids, mask, current, twin.kv_scales))
    stats = logprob_mismatch(torch.cat(prev), torch.cat(gen), torch.cat(masks))
    frac = {
        kind: float(sum(c.saturated[:, j].sum() for c in saturated))
        / float(sum(c.total[:, j].sum() for c in saturated))
        for j, kind in ((1, "k"), (2, "v"))
    }
    return {"stats": stats, "frac": frac}


def table(setup: dict, steps: int) -> str:
    setup["rollouts"] = [rollout(setup, seed) for seed in range(steps + 1)]
    rows = [
        "| format | KV cache | calibration rule | mean abs dlogp | token_mult_prob_error "
        "| gen_kl_error (k3) | max abs dlogp | K saturated | V saturated | tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fmt in FORMATS:
        for kv in KV_CACHES:
            for reduction in KV_REDUCTIONS:
                r = measure(setup, fmt, kv, reduction, steps)
                s = r["stats"]
                rows.append(
                    f"| {fmt} | {kv} | {RULE_LABEL[reduction]} | {s.mean_abs_delta:.5f} "
                    f"| {s.token_mult_prob_error:.5f} | {s.gen_kl_error:.6f} "
                    f"| {s.max_abs_delta:.3f} | {100 * r['frac']['k']:.4f} % "
                    f"| {100 * r['frac']['v']:.4f} % | {s.n_tok} |"
                )
                print(rows[-1], flush=True)
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="steps (sample seeds) pooled")
    parser.add_argument("--cache-dir", default="runs/.cache", help="warm-start cache")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    parts = []
    for setup in (embedded_setup(args.cache_dir), random_setup()):
        parts.append(f"{setup['what']}:\n\n{table(setup, args.steps)}")
    body = (
        "Which FP8 KV calibration rule gives the smaller rollout mismatch "
        "(`benchmarks/bench_kv_calibration.py`; `KVScaleConfig.reduction`, "
        "`RolloutPrecisionConfig.kv_calibration_reduction`). Scales calibrated trainer-side "
        f"on the previous step's rollouts (prompt + response, padding included, micro-batches "
        f"of {MICRO_BATCH} sequences: one observation per micro-batch and layer), as NeMo-RL's "
        "GRPO recalibrates after each update; this step's responses (sampled from the fp32 "
        "model, the same tokens for every rule) scored by the twin through its quantized KV "
        "cache against the fp32 model; "
        f"{args.steps} steps pooled. Saturated: the K / V elements the cache wrote with "
        "|x| > scale * 448.\n\n" + "\n\n".join(parts)
    )
    print(body)
    if not args.no_record:
        record_section(
            "kv_calibration",
            "FP8 KV calibration rule vs rollout mismatch (written by code)",
            body,
            path=LOW_PRECISION_MD,
        )


if __name__ == "__main__":
    main()
