# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What the refit readback costs the simulated engine -> docs/benchmarks.md "refit_readback".

Per rollout format (with an FP8 KV cache, so the KV-scale readback runs too), on the
embedded default's model shape (random-init Qwen2, hidden 256, 2 layers, vocab 512):
one refit (``sync_weights`` with its calibration batch of 8 prompts) with
``verify_refit`` off and on, and one rollout of the default's size (64 prompts x 33 new
tokens), interleaved medians, side by side in one run. The readback's share of a step is
(on - off) / (off + rollout): the step also scores and trains, so this is an upper bound.

    python -m benchmarks.bench_refit_readback [--repeats 5] [--no-record]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks._record import record_section
from benchmarks._timing import interleaved_medians
from benchmarks.bench_fp8_twin import tiny_qwen2
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.twin import RolloutTwin

FORMATS = ("fp8", "mxfp8", "nvfp4_w4a16", "nvfp4_w4a4")
PROMPTS, PROMPT_LEN, NEW = 64, 16, 33


def measure(repeats: int) -> list[tuple[str, float, float, float]]:
    """(format, refit s without readback, with readback, rollout s) per format."""
    model = tiny_qwen2(256, layers=2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 512, (PROMPTS, PROMPT_LEN), generator=g)
    mask = torch.ones_like(ids)
    rows = []
    for fmt in FORMATS:
        twins = {
            verify: RolloutTwin(model, RolloutPrecisionConfig(format=fmt, kv_cache="fp8", verify_refit=verify))
            for verify in (False, True)
        }

        def refit(twin=None):
            return lambda: twin.sync_weights(weights, calibration_input_ids=ids[:8])

        def rollout(twin=twins[False]):
            twin.generate(ids, mask, max_new_tokens=NEW, generator=torch.Generator().manual_seed(1))

        t = interleaved_medians({"off": refit(twins[False]), "on": refit(twins[True]), "rollout": rollout}, repeats)
        assert twins[True].readback.exact  # healthy: the readback is exact
        rows.append((fmt, t["off"], t["on"], t["rollout"]))
    return rows


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    lines = [
        f"One refit of a random-init Qwen2 (hidden 256, 2 layers, vocab 512; the default's "
        f"shape) with an FP8 KV cache and a calibration batch of 8 prompts, and one rollout of "
        f"{PROMPTS} prompts x {NEW} new tokens; medians of {args.repeats} interleaved repeats, "
        "2 torch threads, fp32.",
        "",
        "| format | refit (s) | refit + readback (s) | readback / refit | rollout (s) | readback / (refit + rollout) |",
        "|---|---|---|---|---|---|",
    ]
    for fmt, off, on, roll in measure(args.repeats):
        lines.append(
            f"| {fmt} | {off:.4f} | {on:.4f} | {(on - off) / off:+.0%} | {roll:.3f} | {(on - off) / (off + roll):.1%} |"
        )
    body = "\n".join(lines)
    if not args.no_record:
        record_section("refit_readback", "Refit readback of the simulated engine: its cost", body)
    return body


if __name__ == "__main__":
    print(main())
