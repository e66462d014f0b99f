# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Mismatch attribution on the twin's default model, written into docs/low_precision.md.

``nemo-ais attribute`` (:func:`nemo_ais.tools.attribution.attribute_mismatch`) on the
embedded recipe's warm-started Qwen2 (the preset ``default.yaml``, the model and prompts of
``bench_fp8_twin``'s ``embedded`` table: :func:`nemo_ais.embedded.twin_setup.twin_setup`)
for the harsh 4-bit setting (NVFP4 W4A4 + NVFP4 KV) and the default experiment's FP8 W8A8
+ FP8 KV: the groups and top sources as markdown tables in section ``attribution`` of
docs/low_precision.md, one PNG per setting in docs/img/.

    python -m benchmarks.bench_attribution [--threads 1] [--cache-dir runs/.cache] [--no-record]
"""

import argparse
import time

import torch

from benchmarks._record import BENCH_MD, record_section
from benchmarks.bench_fp8_twin import BATCH, embedded_setup
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.tools.attribution import attribute_mismatch, attribution_markdown, plot_attribution

LOW_PRECISION_MD = BENCH_MD.parent / "low_precision.md"
IMG = BENCH_MD.parent / "img"
# (rollout precision, sources shown in the docs table)
SETTINGS = [
    (RolloutPrecisionConfig(format="nvfp4_w4a4", kv_cache="nvfp4"), 10),
    (RolloutPrecisionConfig(format="fp8", kv_cache="fp8"), 6),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-dir", default="runs/.cache", help="warm-start cache")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    setup = embedded_setup(args.cache_dir)
    parts = []
    for config, top in SETTINGS:
        t0 = time.perf_counter()
        att = attribute_mismatch(
            setup["model"],
            config,
            setup["ids"],
            setup["mask"],
            max_new_tokens=setup["max_new_tokens"],
            generator=torch.Generator().manual_seed(0),
            eos_token_id=setup["eos"],
            pad_token_id=setup["pad"],
            what=setup["what"],
        )
        seconds = time.perf_counter() - t0
        png = f"attribution_{config.format}_{config.kv_cache}_kv.png"
        if not args.no_record:
            plot_attribution(att, IMG / png, top=top)
        parts.append(
            f"### {config.format} + {config.kv_cache} KV cache\n\n"
            f"{attribution_markdown(att, top=top)}\n![attribution](img/{png})\n\n"
            f"({len(att.rows)} sources, {2 * (len(att.rows) + len(att.groups)) + 3} scoring "
            f"forwards in {seconds:.0f} s.)"
        )
        print(parts[-1], flush=True)
    if not args.no_record:
        record_section(
            "attribution",
            "Mismatch attribution on the default model (written by code)",
            f"`nemo-ais attribute` on the twin's default model ({BATCH} held-out prompts, "
            "responses sampled by the fully quantized twin at temperature 1, seed 0). Every "
            "mismatch here is teacher-forced (one scoring forward per subset of sources): the "
            "all-quantized row is the twin's `score` of the sampled tokens, where the "
            "per-format table above uses the generation log-probs (KV cache filled token by "
            "token); the two agree closely, not bit for bit.\n\n" + "\n\n".join(parts),
            path=LOW_PRECISION_MD,
        )


if __name__ == "__main__":
    main()
