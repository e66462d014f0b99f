# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Model-scale refit: seconds per weight sync per GPU for FP8, MXFP8 and NVFP4.

A Qwen3-8B-shaped (vLLM TP 1, ``configs/nemo_rl/qwen3_8b_2n8g_fp8.yaml``) and a
Qwen3-30B-A3B-shaped (vLLM TP 2, ``configs/nemo_rl/qwen3_30b_a3b_2n8g_fp8_ep8.yaml``)
state dict, one TP rank's shard of every quantized linear weight (q/k/v/o, gate/up/down,
each of the 128 experts), random bf16 in the real shapes (``nemo_ais.preflight.MODEL_SHAPES``),
resident on the device as a trainer holds it. Per format, timed in one process:

* ``current``: the refit stream as it was (``fp8_weight_stream`` / ``block_weight_stream``
  with Triton off, ``without_triton``, and no ``num_experts``): one HF tensor at a time
  (each expert separately) on the PyTorch path, outputs dropped as they are yielded;
* ``stream``: the refit stream now: the public quantizers take the Triton kernels on CUDA
  and ``num_experts`` quantizes each layer's ``[128, N, K]`` expert stack of one projection
  in one call (the per-expert views of one buffer are stacked without a copy); ``stream 1st``
  is its first refit in the process (every tensor planned), ``stream`` the next ones (each
  reuses the plans of the refit before: the steady state of training);
* ``fused``: :mod:`nemo_ais.kernels.triton_quant` called directly, one launch per dense
  weight and per expert stack ``[128, N, K]``; NVFP4's fused layers (q/k/v, gate/up, each
  expert's gate/up) share one amax as in the stream, taken by one absmax launch per
  tensor (the stream's floor: no names, no checks, no Python per tensor);
* ``copy_``: ``y.copy_(x)`` of the same tensors into preallocated buffers (the device's
  achievable bandwidth); fraction of copy_ bandwidth = t(copy_) / t(fused).

Embeddings, ``lm_head`` and norms stay BF16 (no quantizer runs) and are not counted.

    python -m benchmarks.bench_refit_scale                       # a GPU, full models
    python -m benchmarks.bench_refit_scale --smoke   # CPU: checks the script (interpreter)
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass

import torch

from benchmarks._record import record_section
from nemo_ais.formats.dispatch import without_triton
from nemo_ais.fp8 import BlockSyncConfig, Fp8SyncConfig, block_weight_stream, fp8_weight_stream
from nemo_ais.kernels.triton_quant import (
    quantize_blockwise_triton,
    quantize_mxfp8_triton,
    quantize_nvfp4_experts_triton,
    quantize_nvfp4_triton,
)
from nemo_ais.preflight import MODEL_SHAPES
from nemo_ais.refit.stream import _PLAN_CACHES

FORMATS = ("nvfp4", "fp8", "mxfp8")  # the headline first: a cut-off run keeps it
# (model key, vLLM tensor-parallel size of the shipped config)
MODELS = {"qwen3-30b-a3b": ("qwen3-30b-a3b", 2), "qwen3-8b": ("qwen3-8b", 1)}


@dataclass
class Layer:
    """One decoder layer's quantized weights on one TP rank: dense ``[N, K]``, experts ``[E, N, K]``."""

    dense: dict[str, torch.Tensor]
    experts: dict[str, torch.Tensor]


def build_layers(key: str, tp: int, layers: int | None, device, experts: int | None, shrink=1):
    """Random bf16 TP-rank shards of every quantized linear weight, per layer.

    ``shrink`` divides the hidden, head and dense MLP widths (a CPU smoke run).
    """
    m = MODEL_SHAPES[key]
    if shrink > 1:
        m = dataclasses.replace(
            m,
            hidden_size=m.hidden_size // shrink,
            head_dim=m.head_dim // shrink,
            intermediate_size=m.intermediate_size // shrink,
        )
    h, hd = m.hidden_size, m.head_dim
    q_rows = m.num_attention_heads * hd // tp
    kv_rows = max(m.num_key_value_heads // tp, 1) * hd  # fewer KV heads than ranks: replicated
    g = torch.Generator(device=device).manual_seed(0)

    def w(*shape):
        return (torch.randn(shape, generator=g, device=device) * 0.02).to(torch.bfloat16)

    out = []
    for _ in range(m.num_layers if layers is None else layers):
        dense = {
            "self_attn.q_proj": w(q_rows, h),
            "self_attn.k_proj": w(kv_rows, h),
            "self_attn.v_proj": w(kv_rows, h),
            "self_attn.o_proj": w(h, q_rows),
        }
        stacks = {}
        if m.num_experts:
            e, i = experts or m.num_experts, m.moe_intermediate_size // tp
            stacks = {"gate_proj": w(e, i, h), "up_proj": w(e, i, h), "down_proj": w(e, h, i)}
        else:
            i = m.intermediate_size // tp
            dense |= {"mlp.gate_proj": w(i, h), "mlp.up_proj": w(i, h), "mlp.down_proj": w(h, i)}
        out.append(Layer(dense, stacks))
    return out


def named_tensors(layers: list[Layer]):
    """Unfused HF ``(name, tensor)`` pairs in the checkpoint's order: each expert's
    gate/up/down together, expert by expert (what the stream takes)."""
    for li, layer in enumerate(layers):
        for name, t in layer.dense.items():
            yield f"model.layers.{li}.{name}.weight", t
        n_experts = next(iter(layer.experts.values())).shape[0] if layer.experts else 0
        for e in range(n_experts):
            for name, stack in layer.experts.items():
                yield f"model.layers.{li}.mlp.experts.{e}.{name}.weight", stack[e]


def stream_refit(fmt: str, layers: list[Layer], num_experts: int | None = None) -> None:
    """The refit stream, consumed tensor by tensor (``num_experts``: expert stacks)."""
    if fmt == "fp8":
        config = Fp8SyncConfig(backend="torch", num_experts=num_experts)
        stream = fp8_weight_stream(named_tensors(layers), config)
    else:
        fmt_name = "mxfp8" if fmt == "mxfp8" else "nvfp4_w4a16"
        config = BlockSyncConfig(format=fmt_name, num_experts=num_experts)
        stream = block_weight_stream(named_tensors(layers), config)
    for _ in stream:
        pass


def current_refit(fmt: str, layers: list[Layer]) -> None:
    """The stream as it was: PyTorch path, one expert at a time."""
    with without_triton():
        stream_refit(fmt, layers)


def _amax(t: torch.Tensor, dim=None) -> torch.Tensor:
    """fp32 max |t| (over ``dim``): one reduction, no |t| temporary (exact in bf16)."""
    return torch.linalg.vector_norm(t, float("inf"), dim=dim).float()


def fused_refit(fmt: str, layers: list[Layer]) -> None:
    """The fused kernels: one launch per dense weight and per expert stack."""
    for layer in layers:
        if fmt == "nvfp4":
            d = layer.dense
            qkv = [d["self_attn.q_proj"], d["self_attn.k_proj"], d["self_attn.v_proj"]]
            group = torch.stack([_amax(t) for t in qkv]).amax()
            for t in qkv:
                quantize_nvfp4_triton(t, group)
            quantize_nvfp4_triton(d["self_attn.o_proj"])
            if "mlp.gate_proj" in d:
                pair = torch.maximum(_amax(d["mlp.gate_proj"]), _amax(d["mlp.up_proj"]))
                quantize_nvfp4_triton(d["mlp.gate_proj"], pair)
                quantize_nvfp4_triton(d["mlp.up_proj"], pair)
                quantize_nvfp4_triton(d["mlp.down_proj"])
            if layer.experts:
                s = layer.experts
                pair = torch.maximum(_amax(s["gate_proj"], (1, 2)), _amax(s["up_proj"], (1, 2)))
                quantize_nvfp4_experts_triton(s["gate_proj"], pair)
                quantize_nvfp4_experts_triton(s["up_proj"], pair)
                quantize_nvfp4_experts_triton(s["down_proj"])
            continue
        quantize = quantize_blockwise_triton if fmt == "fp8" else quantize_mxfp8_triton
        for t in (*layer.dense.values(), *layer.experts.values()):
            quantize(t)


def copy_refit(layers: list[Layer], targets: list[torch.Tensor]) -> None:
    tensors = [t for layer in layers for t in (*layer.dense.values(), *layer.experts.values())]
    for t, y in zip(tensors, targets, strict=True):
        y.copy_(t)


def timed(fn, sync, repeats: int) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` synchronized runs."""
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    parser.add_argument("--layers", type=int, default=None, help="fewer layers (CPU smoke)")
    parser.add_argument("--experts", type=int, default=None, help="fewer experts (CPU smoke)")
    parser.add_argument("--repeats", type=int, default=3, help="fused and copy_ runs")
    parser.add_argument("--current-repeats", type=int, default=1)
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="check this script on CPU: 1 layer, 2 experts, widths / 8, nothing recorded",
    )
    args = parser.parse_args()
    shrink = 1
    if args.smoke:
        args.layers, args.experts, args.no_record, shrink = 1, 2, True, 8
        args.repeats = args.current_repeats = 1
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    head = (
        "| model (vLLM TP) | format | quantized params / GPU | current s | stream 1st s | stream s | fused s | "
        "copy_ s | current / stream | stream / copy_ bandwidth | fused / copy_ bandwidth |"
    )
    rows = [head, "|---|---|" + "---:|" * (head.count("|") - 3)]

    def write(rows: list[str]) -> str:
        """The section's body so far; recorded after every row (a cut-off run keeps its rows)."""
        dev = torch.cuda.get_device_name() if cuda else "CPU (Triton interpreter: a smoke run)"
        scale = "" if args.layers is None else f" ({args.layers} layer(s) only)"
        body = "\n".join(rows) + (
            f"\n\n{dev}{scale}. One TP rank's shard of every quantized linear weight of the "
            "shipped configs (Qwen3-8B: vLLM TP 1; Qwen3-30B-A3B: vLLM TP 2, EP 1, 128 experts of "
            "moe_intermediate 768 / 2), random bf16, resident on the device. `current`: the refit "
            "stream of nemo_ais.fp8 (fp8_weight_stream, block_weight_stream nvfp4_w4a16 / mxfp8) "
            "as it was: the PyTorch path (Triton off), one HF tensor at a time; `stream`: the same "
            "stream now (Triton on CUDA, num_experts=128: one call per layer's [128, N, K] expert "
            "stack of one projection), `stream 1st` its first refit in the process (every tensor planned), "
            "`stream` the next ones (the plans cached from the previous refit: every training step); `fused`: nemo_ais.kernels.triton_quant called directly, one "
            "launch per dense weight and per expert stack (NVFP4 fused layers share one amax, as "
            "in the stream); `copy_`: y.copy_(x) of the same tensors. Wall seconds per refit, "
            f"synchronized; median of {args.repeats} (stream, fused, copy_) and "
            f"{args.current_repeats} (current) runs after a one-layer warm-up. Fraction of copy_ "
            "bandwidth = t(copy_) / t(stream or fused)."
        )
        if not args.no_record:
            record_section("refit_scale", "Model-scale refit per GPU: FP8, MXFP8, NVFP4", body)
        return body

    for model in args.models:
        key, tp = MODELS[model]
        layers = build_layers(key, tp, args.layers, device, args.experts, shrink)
        tensors = [t for la in layers for t in (*la.dense.values(), *la.experts.values())]
        params = sum(t.numel() for t in tensors)
        targets = [torch.empty_like(t) for t in tensors]
        t_copy = timed(lambda la=layers, y=targets: copy_refit(la, y), sync, args.repeats)
        del targets
        n_experts = max((s.shape[0] for la in layers for s in la.experts.values()), default=None)
        for fmt in args.formats:
            fused_refit(fmt, layers[:1])  # JIT warm-up
            stream_refit(fmt, layers[:1], n_experts)
            current_refit(fmt, layers[:1])
            t_fused = timed(lambda f=fmt, la=layers: fused_refit(f, la), sync, args.repeats)
            _PLAN_CACHES.clear()  # the first refit of a run plans every tensor
            t_first = timed(lambda f=fmt, la=layers, e=n_experts: stream_refit(f, la, e), sync, 1)
            t_stream = timed(lambda f=fmt, la=layers, e=n_experts: stream_refit(f, la, e), sync, args.repeats)
            t_cur = timed(lambda f=fmt, la=layers: current_refit(f, la), sync, args.current_repeats)
            rows.append(
                f"| {model} (TP {tp}) | {fmt} | {params / 1e6:.0f} M | {t_cur:.3f} | "
                f"{t_first:.3f} | {t_stream:.3f} | {t_fused:.3f} | {t_copy:.3f} | **{t_cur / t_stream:.1f}x** | "
                f"**{t_copy / t_stream:.2f}** | {t_copy / t_fused:.2f} |"
            )
            print(rows[-1], flush=True)
            write(rows)
        del layers, tensors
        if cuda:
            torch.cuda.empty_cache()
    body = write(rows)
    print(body)


if __name__ == "__main__":
    main()
