# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""What ``loss_fn.ais.bypass`` saves on the cluster path: the trainer's ``prev_logprobs``
forward against its training pass, on a Qwen3-8B-shaped decoder.

With bypass, NeMo-RL's GRPO driver skips the policy's ``get_logprobs`` over the whole
rollout batch (pi_old := the rollout's log-probs). What that saves per step is the time of
that forward: a no-grad forward of every micro-batch, the fp32 log-softmax over the
vocabulary and the gather of the sampled tokens' log-probs (what the workers do). What is
left is the training pass: the same forward with autograd, a policy-gradient surrogate,
the backward, and one AdamW step. This script times both on one GPU, side by side
(interleaved within each repeat, CUDA events, median), for a decoder with Qwen3-8B's
widths (hidden 4096, MLP 12288, 32 query / 8 KV heads of 128, vocab 151936, untied head)
and ``--layers`` of its 36 layers (random weights, bf16, no download: ``transformers``
builds it from the config), and reports the saved fraction of the trainer's time,
t_fwd / (t_fwd + t_train). Generation (vLLM) is not timed: the saved fraction of a whole
GRPO step is that fraction times the trainer's share of the step.

Only one GPU and plain PyTorch (no TP/PP, no Megatron, no activation checkpointing):
Megatron's fused kernels and checkpointing change both times, checkpointing adds a second
forward to the training pass (fraction smaller).

    python -m benchmarks.bench_prev_logprobs --layers 4 16       # records section prev_logprobs
    python -m benchmarks.bench_prev_logprobs --tiny --no-record   # CPU smoke run
"""

from __future__ import annotations

import argparse

import torch

from benchmarks._record import record_section
from benchmarks._timing import cpu_timer, cuda_timer, interleaved_medians
from nemo_ais.preflight.model_shapes import MODEL_SHAPES

_SHAPE = MODEL_SHAPES["qwen3-8b"]  # the project's one model-shape table
QWEN3_8B = dict(
    hidden_size=_SHAPE.hidden_size,
    intermediate_size=_SHAPE.intermediate_size,
    num_attention_heads=_SHAPE.num_attention_heads,
    num_key_value_heads=_SHAPE.num_key_value_heads,
    head_dim=_SHAPE.head_dim,
    vocab_size=_SHAPE.vocab_size,
    tie_word_embeddings=_SHAPE.tie_word_embeddings,
    max_position_embeddings=40960,  # Qwen3-8B's config.json (not in the shape table)
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
)
TINY = dict(
    QWEN3_8B,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
)


def _model(layers: int, tiny: bool, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**(TINY if tiny else QWEN3_8B), num_hidden_layers=layers)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).to(device=device, dtype=dtype), cfg


def _token_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token, fp32 log-softmax over the vocabulary (as the workers do)."""
    logits = model(input_ids=ids).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def measure(layers: int, args: argparse.Namespace, device: torch.device) -> str:
    """One table row: both passes of a ``layers``-layer model, interleaved, medians."""
    cuda = device.type == "cuda"
    model, cfg = _model(layers, args.tiny, device, torch.bfloat16 if cuda else torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7, foreach=True)
    gen = torch.Generator().manual_seed(1)
    shape = (args.micro_batch, args.seq_len)
    batches = [torch.randint(0, cfg.vocab_size, shape, generator=gen).to(device) for _ in range(args.micro_batches)]
    adv = torch.randn(args.micro_batch, args.seq_len - 1, generator=gen).to(device)

    def prev_logprobs():  # what bypass skips: the no-grad get_logprobs forward
        with torch.no_grad():
            for ids in batches:
                _token_logprobs(model, ids)

    def train_pass():  # what stays: forward with autograd, surrogate, backward, AdamW
        for ids in batches:
            lp = _token_logprobs(model, ids)
            ratio = torch.exp(lp - lp.detach())
            (-(ratio * adv).mean() / len(batches)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    timer = cuda_timer() if cuda else cpu_timer
    fns = {"fwd": prev_logprobs, "train": train_pass}  # the warm-up builds AdamW's state
    t = interleaved_medians(fns, args.repeats, timer)
    n_params = sum(p.numel() for p in model.parameters())
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    return (
        f"| {layers} | {n_params / 1e9:.2f} | {args.micro_batch * args.seq_len * args.micro_batches}"
        f" | {t['fwd'] * 1e3:.0f} | {t['train'] * 1e3:.0f} | {t['train'] / t['fwd']:.2f} | "
        f"**{t['fwd'] / (t['fwd'] + t['train']):.3f}** | {peak:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--micro-batches", type=int, default=4, help="per step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="small widths (CPU smoke run)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    rows = []
    for layers in args.layers:
        rows.append(measure(layers, args, device))
        print(rows[-1], flush=True)
        if cuda:
            torch.cuda.empty_cache()
    head = (
        "| layers (of 36) | params (B) | tokens / step | prev_logprobs forward ms | "
        "train pass ms | train / forward | saved fraction of trainer time | peak GiB |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    dev = torch.cuda.get_device_name() if cuda else "CPU"
    body = (
        head + "\n" + "\n".join(rows) + "\n\n"
        f"{dev}; {'bf16' if cuda else 'fp32'}; Qwen3-8B widths"
        f"{' (tiny widths)' if args.tiny else ''}, {args.micro_batches} micro-batches of "
        f"{args.micro_batch} x {args.seq_len} tokens per step; median of {args.repeats} repeats, "
        "forward and train pass interleaved in each, CUDA events. Saved fraction = "
        "t(forward) / (t(forward) + t(train pass)): what `loss_fn.ais.bypass` removes from "
        "the trainer's time per GRPO step (generation not included). The embedded recipe's "
        "measurement is section `bypass_embedded`."
    )
    print(body)
    if not args.no_record:
        record_section("prev_logprobs", "Bypass on the cluster path: prev_logprobs forward vs train pass", body)


if __name__ == "__main__":
    main()
