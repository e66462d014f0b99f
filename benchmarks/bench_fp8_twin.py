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
"""Simulated FP8 rollout engine: CPU generation speed and the log-prob mismatch it makes.

Tiny random-init Qwen2 models (built offline from a config, HF default init 0.02).
Speed: 64 prompts x 16 tokens -> 24 new tokens, median of ``--repeats`` after a warm-up,
for the plain fp32 model and the twin (W8A8; W8A8 + FP8 KV). Mismatch: the twin's
generation log-probs against the fp32 model's teacher-forced log-probs of the same
tokens (``prev_logprobs`` vs ``generation_logprobs``), by hidden size.

    python benchmarks/bench_fp8_twin.py [--threads 2] [--repeats 3] [--no-record]
"""

import argparse
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from benchmarks._record import record_section
from nemo_ais.fp8.twin import Fp8RolloutConfig, Fp8Twin, generate, logprob_mismatch, score_responses

VOCAB, BATCH, PROMPT, NEW = 512, 64, 16, 24


def tiny_qwen2(hidden: int, layers: int = 4, seed: int = 0) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(2, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


def prompts(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (BATCH, PROMPT), generator=g)
    mask = torch.ones_like(ids)
    lengths = torch.randint(PROMPT // 2, PROMPT + 1, (BATCH,), generator=g)
    for b, n in enumerate(lengths.tolist()):  # left padding
        mask[b, : PROMPT - n] = 0
        ids[b, : PROMPT - n] = 0
    return ids, mask


def speed_table(repeats: int) -> str:
    """Median seconds per engine; repeats interleaved round-robin so load drift hits all."""
    model = tiny_qwen2(256)
    ids, mask = prompts()
    twin = Fp8Twin(model, Fp8RolloutConfig())
    twin_kv = Fp8Twin(model, Fp8RolloutConfig(kv_cache_fp8=True))
    engines = {
        "fp32 model (plain HF forward)": lambda g: generate(
            model, ids, mask, max_new_tokens=NEW, generator=g
        ),
        "twin, W8A8": lambda g: twin.generate(ids, mask, max_new_tokens=NEW, generator=g),
        "twin, W8A8 + FP8 KV": lambda g: twin_kv.generate(
            ids, mask, max_new_tokens=NEW, generator=g
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in engines}
    for fn in engines.values():  # warm-up
        fn(torch.Generator().manual_seed(0))
    for r in range(repeats):
        for name, fn in engines.items():
            g = torch.Generator().manual_seed(r)
            t0 = time.perf_counter()
            fn(g)
            times[name].append(time.perf_counter() - t0)
    rows = ["| engine | seconds (median) | tokens/s | vs fp32 |", "|---|---|---|---|"]
    base = statistics.median(next(iter(times.values())))
    for name, ts in times.items():
        sec = statistics.median(ts)
        rows.append(f"| {name} | {sec:.3f} | {BATCH * NEW / sec:.0f} | {sec / base:.2f}x |")
    return "\n".join(rows)


def mismatch_table(hiddens: list[int]) -> str:
    ids, mask = prompts()
    rows = [
        "| hidden | layers | engine | mean abs dlogp | token_mult_prob_error | "
        "exp(mean abs dlogp) | max abs dlogp | tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for hidden in hiddens:
        model = tiny_qwen2(hidden)
        for name, cfg in (
            ("W8A8", Fp8RolloutConfig()),
            ("W8A8 + FP8 KV", Fp8RolloutConfig(kv_cache_fp8=True)),
        ):
            twin = Fp8Twin(model, cfg)
            out = twin.generate(
                ids, mask, max_new_tokens=NEW, generator=torch.Generator().manual_seed(0)
            )
            ref = score_responses(model, ids, mask, out.response_ids)
            s = logprob_mismatch(out.logprobs, ref, out.response_mask)
            rows.append(
                f"| {hidden} | 4 | {name} | {s.mean_abs_delta:.4f} | {s.token_mult_prob_error:.4f} "
                f"| {s.exp_mean_abs_delta:.4f} | {s.max_abs_delta:.3f} | {s.n_tok} |"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hiddens", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    speed = speed_table(args.repeats)
    mismatch = mismatch_table(args.hiddens)
    body = (
        f"Generation of {BATCH} left-padded prompts ({PROMPT // 2}-{PROMPT} tokens) x {NEW} "
        "new tokens, tiny random-init Qwen2 (4 layers, hidden 256, vocab 512), fp32 "
        "compute, multinomial sampling at temperature 1:\n\n"
        f"{speed}\n\nLog-prob mismatch of the twin's generation log-probs against the fp32 "
        "model's teacher-forced log-probs of the same tokens (same prompts, seed 0):\n\n"
        f"{mismatch}\n"
    )
    print(body)
    if not args.no_record:
        record_section("fp8_twin", "Simulated FP8 rollout engine (twin)", body)


if __name__ == "__main__":
    main()
