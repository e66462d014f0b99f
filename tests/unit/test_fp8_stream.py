# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The vLLM refit stream: names, dtypes, shapes, keep rules, TP checks, dry run, memory bound."""

from __future__ import annotations

import importlib.util
import re
import weakref

import pytest
import torch
from pydantic import ValidationError
from skip_policy import NO_CUDA, TE_INSTALLED, TE_MODULE, require_te

from nemo_ais.fp8 import quantize_blockwise
from nemo_ais.refit.stream import Fp8SyncConfig, fp8_weight_stream, plan_fp8_sync, scale_name

H, FF, Q, KV, V, L = (256, 384, 256, 128, 512, 4)  # hidden, intermediate, q out, kv out, vocab, layers


def _qwen2_shapes(n_layers: int = L) -> list[tuple[str, tuple[int, ...]]]:
    """Tiny Qwen2-like (unfused HF names, q/k/v biases) in Megatron-Bridge export order."""
    shapes = [("model.embed_tokens.weight", (V, H))]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (H,)),
            (p + "self_attn.q_proj.weight", (Q, H)),
            (p + "self_attn.q_proj.bias", (Q,)),
            (p + "self_attn.k_proj.weight", (KV, H)),
            (p + "self_attn.k_proj.bias", (KV,)),
            (p + "self_attn.v_proj.weight", (KV, H)),
            (p + "self_attn.v_proj.bias", (KV,)),
            (p + "self_attn.o_proj.weight", (H, Q)),
            (p + "post_attention_layernorm.weight", (H,)),
            (p + "mlp.gate_proj.weight", (FF, H)),
            (p + "mlp.up_proj.weight", (FF, H)),
            (p + "mlp.down_proj.weight", (H, FF)),
        ]
    return [*shapes, ("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]


def _moe_shapes(n_experts: int = 3) -> list[tuple[str, tuple[int, ...]]]:
    """Tiny Qwen2-MoE-like layer: router, routed experts, shared expert and its gate."""
    p = "model.layers.0."
    shapes = [
        ("model.embed_tokens.weight", (V, H)),
        (p + "self_attn.q_norm.weight", (128,)),
        (p + "self_attn.q_proj.weight", (Q, H)),
        (p + "mlp.gate.weight", (n_experts, H)),
        (p + "mlp.shared_expert_gate.weight", (1, H)),
        (p + "mlp.shared_expert.gate_proj.weight", (FF, H)),
        (p + "mlp.shared_expert.down_proj.weight", (H, FF)),
    ]
    for e in range(n_experts):
        shapes += [
            (p + f"mlp.experts.{e}.gate_proj.weight", (128, H)),
            (p + f"mlp.experts.{e}.up_proj.weight", (128, H)),
            (p + f"mlp.experts.{e}.down_proj.weight", (H, 128)),
        ]
    return shapes


def _tensors(shapes, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return [(n, torch.randn(s, generator=g).to(dtype)) for n, s in shapes]


def _quantized(entries) -> set[str]:
    return {name for name, t in entries if t.dtype == torch.float8_e4m3fn}


def test_qwen2_names_dtypes_shapes_and_bits():
    tensors = _tensors(_qwen2_shapes())
    out = list(fp8_weight_stream(tensors, Fp8SyncConfig()))
    by_name = dict(out)
    expected_q = {n for n, _ in tensors if re.search(r"_proj\.weight$", n)}
    assert _quantized(out) == expected_q and len(expected_q) == 7 * L
    assert len(out) == len(tensors) + len(expected_q)  # one extra scale per quantized weight
    for name, x in tensors:
        if name in expected_q:
            q, s = by_name[name], by_name[scale_name(name)]
            assert q.shape == x.shape and s.dtype == torch.float32
            assert s.shape == (-(-x.shape[0] // 128), -(-x.shape[1] // 128))
            q_ref, s_ref = quantize_blockwise(x, name=name)
            assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
            assert torch.equal(s, s_ref)
        else:
            assert by_name[name] is x  # passed through unchanged, same object
    # a scale immediately follows its weight, as load_weights consumes them in any order
    names = [n for n, _ in out]
    i = names.index("model.layers.1.mlp.down_proj.weight")
    assert names[i + 1] == "model.layers.1.mlp.down_proj.weight_scale_inv"


def test_first_and_last_layers_and_patterns_kept():
    cfg = Fp8SyncConfig(
        num_first_layers_in_bf16=1,
        num_last_layers_in_bf16=1,
        num_layers=L,
        keep_patterns=(r"layers\.2\.mlp\.down_proj",),
    )
    plan = plan_fp8_sync(_tensors(_qwen2_shapes()), cfg)
    reasons = {e.name: e.reason for e in plan.entries}
    quantized = {e.name for e in plan.entries if e.action == "quantize"}
    assert {int(n.split(".")[2]) for n in quantized} == {1, 2}
    assert len(quantized) == 7 + 6
    assert reasons["model.layers.0.self_attn.q_proj.weight"] == "first 1 layers in BF16"
    assert reasons["model.layers.3.mlp.up_proj.weight"] == "last 1 layers in BF16"
    assert reasons["model.layers.2.mlp.down_proj.weight"] == "matches keep_patterns"
    assert reasons["model.layers.1.self_attn.q_proj.bias"] == "not a weight (bias or buffer)"
    assert reasons["model.embed_tokens.weight"] == "embedding"
    assert reasons["lm_head.weight"] == "lm_head"
    assert reasons["model.norm.weight"] == "norm"
    out = list(fp8_weight_stream(_tensors(_qwen2_shapes()), cfg))
    assert _quantized(out) == quantized


def test_moe_router_kept_experts_quantized():
    out = list(fp8_weight_stream(_tensors(_moe_shapes()), Fp8SyncConfig()))
    names = dict(out)
    assert names["model.layers.0.mlp.gate.weight"].dtype == torch.bfloat16
    assert names["model.layers.0.mlp.shared_expert_gate.weight"].dtype == torch.bfloat16
    assert names["model.layers.0.self_attn.q_norm.weight"].dtype == torch.bfloat16
    for e in range(3):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            n = f"model.layers.0.mlp.experts.{e}.{proj}.weight"
            assert names[n].dtype == torch.float8_e4m3fn
            assert names[n.replace(".weight", ".weight_scale_inv")].shape == ((1, 2) if proj != "down_proj" else (2, 1))
    assert names["model.layers.0.mlp.shared_expert.gate_proj.weight"].dtype == torch.float8_e4m3fn
    plan = plan_fp8_sync(_tensors(_moe_shapes()), Fp8SyncConfig())
    reasons = {e.name: e.reason for e in plan.entries}
    assert reasons["model.layers.0.mlp.gate.weight"] == "MoE router"
    assert reasons["model.layers.0.mlp.shared_expert_gate.weight"] == "MoE router"


def test_tp_divisibility_errors_name_tensor_shape_tp_and_dim():
    # tp=2: q_proj out 256/2 = 128 ok; k_proj out 128/2 = 64 is not a multiple of 128
    cfg = Fp8SyncConfig(tp_size=2)
    with pytest.raises(
        ValueError,
        match=r"model\.layers\.0\.self_attn\.k_proj\.weight: shape \[128, 256\] with tp_size=2: "
        r"column-parallel out dim 0 of size 128 gives a per-rank shard of 64",
    ):
        list(fp8_weight_stream(_tensors(_qwen2_shapes(1)), cfg))
    # down_proj [256, 384] is row-parallel: in dim 384 / 2 = 192
    shapes = [("model.layers.0.mlp.down_proj.weight", (H, FF))]
    with pytest.raises(ValueError, match=r"row-parallel in dim 1 of size 384 gives a per-rank shard of 192"):
        list(fp8_weight_stream(_tensors(shapes), cfg))
    # the dry run lists every failing tensor at once: k, v, gate, up, down
    with pytest.raises(ValueError, match=r"^5 tensor\(s\) fail the TP or fused-sibling check") as info:
        plan_fp8_sync(_tensors(_qwen2_shapes(1)), cfg)
    assert str(info.value).count("tp_size=2") == 5
    # non-integer shard: 384 / 5
    with pytest.raises(ValueError, match=r"gate_proj.*shard of 76\.8"):
        plan_fp8_sync(_tensors([("model.layers.0.mlp.gate_proj.weight", (FF, H))]), Fp8SyncConfig(tp_size=5))


def test_tp_replicated_kv_heads_and_bf16_layers_are_not_checked():
    # one KV head of 128 and tp=2: vLLM replicates K/V, each rank holds 128 rows
    shapes = [(f"model.layers.0.self_attn.{p}.weight", (KV, H)) for p in ("k_proj", "v_proj")]
    out = list(fp8_weight_stream(_tensors(shapes), Fp8SyncConfig(tp_size=2, head_dim=128)))
    assert len(_quantized(out)) == 2
    kept = Fp8SyncConfig(tp_size=2, keep_patterns=(r"[qkv]_proj|mlp",))  # a fused layer is kept whole
    plan = plan_fp8_sync(_tensors(_qwen2_shapes(1)), kept)
    assert plan.n_quantized == 1  # o_proj


@pytest.mark.parametrize(
    "name", ["model.layers.1.self_attn.o_proj.weight", "model.layers.1.post_attention_layernorm.weight"]
)
def test_nan_weight_raises_naming_tensor(name):
    tensors = _tensors(_qwen2_shapes(2))
    bad = dict(tensors)[name]
    bad.view(-1)[5] = float("nan")
    with pytest.raises(ValueError, match=re.escape(name) + r": got 1 non-finite value"):
        list(fp8_weight_stream(tensors, Fp8SyncConfig()))


def test_dry_run_report_content():
    shapes = [
        ("model.embed_tokens.weight", (V, H)),
        ("model.layers.0.self_attn.q_proj.weight", (Q, H)),
        ("model.layers.0.mlp.down_proj.weight", (H, FF)),
        ("model.norm.weight", (H,)),
    ]
    meta = [(n, torch.empty(s, dtype=torch.bfloat16, device="meta")) for n, s in shapes]
    plan = plan_fp8_sync(meta, Fp8SyncConfig())
    # bf16 = 2 bytes; fp8 = 1 byte + one fp32 scale per 128x128 tile
    assert [e.bytes_before for e in plan.entries] == [V * H * 2, Q * H * 2, H * FF * 2, H * 2]
    assert [e.bytes_after for e in plan.entries] == [V * H * 2, Q * H + 2 * 2 * 4, H * FF + 2 * 3 * 4, H * 2]
    assert plan.bytes_before == 262144 + 131072 + 196608 + 512
    assert plan.bytes_after == 262144 + 65552 + 98328 + 512
    text = str(plan)
    assert (
        "| model.layers.0.self_attn.q_proj.weight | [256, 256] | bfloat16 | quantize | linear projection (fp8) | 131072 | 65552 |"
        in text
    )
    assert "| model.embed_tokens.weight | [512, 256] | bfloat16 | keep | embedding | 262144 | 262144 |" in text
    assert "2 of 4 tensors quantized; 590336 -> 426536 bytes (0.723x)" in text


def test_disabled_passes_everything_through():
    tensors = _tensors(_qwen2_shapes(1))
    out = list(fp8_weight_stream(tensors, Fp8SyncConfig(enabled=False)))
    assert len(out) == len(tensors) and all(a is b for (_, a), (_, b) in zip(out, tensors, strict=True))


def test_stream_holds_at_most_one_quantized_tensor():
    """Peak extra memory: count live stream-made tensors via weakrefs at every step."""
    shapes = _qwen2_shapes(3) + _moe_shapes()
    inputs, outputs, held_at_request = [], [], []

    def producer():  # creates each weight on demand, keeps only a weakref to it
        g = torch.Generator().manual_seed(1)
        for name, shape in shapes:
            # the stream asks for the next input: it must not still hold the previous
            # output (else two quantized tensors would coexist during the next quantize)
            held_at_request.append(len(live_bytes(outputs)))
            t = torch.randn(shape, generator=g).to(torch.bfloat16)
            inputs.append(weakref.ref(t))
            yield name, t
            del t

    def live_bytes(refs):
        alive = [r() for r in refs]
        return [t.numel() * t.element_size() for t in alive if t is not None]

    largest = max((s[0] * s[1] + (-(-s[0] // 128)) * (-(-s[1] // 128)) * 4) for _, s in shapes if len(s) == 2)
    max_live_out, max_live_in, max_out_bytes = 0, 0, 0
    for _name, t in fp8_weight_stream(producer(), Fp8SyncConfig()):
        if t.dtype in (torch.float8_e4m3fn, torch.float32):
            outputs.append(weakref.ref(t))
        del t  # the consumer (vLLM load_weights) copies into its parameter and drops it
        out_alive = live_bytes(outputs)
        max_live_out = max(max_live_out, len(out_alive))
        max_out_bytes = max(max_out_bytes, sum(out_alive))
        max_live_in = max(max_live_in, len(live_bytes(inputs)))
    assert len(outputs) == 2 * (7 * 3 + 3 * 3 + 3)  # all quantized weights and scales seen
    assert max_live_out <= 1, f"{max_live_out} quantized tensors alive at once"
    assert max_out_bytes <= largest
    assert max_live_in <= 1, f"{max_live_in} input tensors alive at once"
    assert len(held_at_request) == len(shapes) and max(held_at_request) == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_last_layers_in_bf16": 2}, "num_last_layers_in_bf16=2 needs num_layers"),
        ({"keep_patterns": ("(",)}, r"keep_patterns: '\(' is not a valid regex"),
        ({"eps": -1.0}, "eps"),
        ({"block": (128, 0)}, r"block\n.*expected two positive ints .*, got \(128, 0\)"),
        ({"tp_size": 0}, "tp_size"),
        ({"family": "d"}, "family"),
        ({"bogus": 1}, "bogus"),
        (
            {"backend": "te"},
            r"backend='te' implements family='multiplier' with block=\(128, 128\) only, got "
            r"family='reciprocal' block=\(128, 128\)",
        ),
        (
            {"backend": "te", "family": "multiplier", "block": (64, 128)},
            r"only, got family='multiplier' block=\(64, 128\)",
        ),
        ({"backend": "triton"}, "backend"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        Fp8SyncConfig(**kwargs)


# ---- quantizer backend (Transformer Engine or the torch reference) -------------------------


def _te_importable() -> bool:
    try:
        return importlib.util.find_spec(TE_MODULE) is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture
def backend_calls(monkeypatch):
    """Record every backend decision (``te_backend.use_te``) and every TE quantization."""
    from nemo_ais.fp8 import te_backend

    calls = {"use_te": [], "te": []}
    real_use_te, real_te = te_backend.use_te, te_backend.quantize_blockwise_te

    def use_te(x, backend, *, name="x", family="multiplier", block=(128, 128)):
        picked = real_use_te(x, backend, name=name, family=family, block=block)
        calls["use_te"].append((name, backend, family, tuple(block), x.device.type, picked))
        return picked

    def quantize_blockwise_te(x, *args, name="x", **kwargs):
        calls["te"].append(name)
        return real_te(x, *args, name=name, **kwargs)

    monkeypatch.setattr(te_backend, "use_te", use_te)
    monkeypatch.setattr(te_backend, "quantize_blockwise_te", quantize_blockwise_te)
    return calls


@pytest.mark.skipif(_te_importable(), reason=TE_INSTALLED)
@pytest.mark.parametrize("family", ["reciprocal", "multiplier"])
def test_auto_backend_without_te_is_the_torch_reference(backend_calls, family):
    assert Fp8SyncConfig().backend == "auto"  # the default
    tensors = _tensors(_qwen2_shapes(n_layers=1))
    out = dict(fp8_weight_stream(tensors, Fp8SyncConfig(family=family)))
    quantized = [n for n, _ in tensors if n.endswith("_proj.weight")]
    # the stream asks the backend switch once per quantized tensor, with its config ...
    assert backend_calls["use_te"] == [(n, "auto", family, (128, 128), "cpu", False) for n in quantized]
    assert backend_calls["te"] == []  # ... and TE is absent: the torch reference runs
    for name, x in tensors:
        if name in quantized:
            q_ref, s_ref = quantize_blockwise(x, family=family, name=name)
            assert torch.equal(out[name].view(torch.uint8), q_ref.view(torch.uint8)), name
            assert torch.equal(out[scale_name(name)], s_ref), name


@pytest.mark.skipif(_te_importable(), reason=TE_INSTALLED)
def test_te_backend_without_te_names_the_extra(backend_calls):
    tensors = _tensors(_qwen2_shapes(n_layers=1))
    stream = fp8_weight_stream(tensors, Fp8SyncConfig(backend="te", family="multiplier"))
    with pytest.raises(ImportError, match=r"pip install 'nemo-ais\[te\]'"):
        list(stream)
    torch_only = list(fp8_weight_stream(tensors, Fp8SyncConfig(backend="torch", family="multiplier")))
    assert len(torch_only) == len(tensors) + 7
    assert backend_calls["use_te"] == [] and backend_calls["te"] == []  # never consulted


@pytest.mark.te
@pytest.mark.gpu
def test_auto_backend_uses_te_on_cuda_with_the_same_bits(backend_calls):
    require_te()  # skips only if TE is absent; a broken TE fails
    if not torch.cuda.is_available():
        pytest.skip(NO_CUDA)
    tensors = [(n, x.cuda()) for n, x in _tensors(_qwen2_shapes(n_layers=1))]
    quantized = [n for n, _ in tensors if n.endswith("_proj.weight")]
    out = dict(fp8_weight_stream(tensors, Fp8SyncConfig(family="multiplier", eps=0.0)))
    assert backend_calls["te"] == quantized  # TE quantized every projection
    for name, x in tensors:
        if name in quantized:
            q_ref, s_ref = quantize_blockwise(x.cpu(), family="multiplier", eps=0.0, name=name)
            assert torch.equal(out[name].cpu().view(torch.uint8), q_ref.view(torch.uint8))
            assert torch.equal(out[scale_name(name)].cpu(), s_ref), name
    # family 'reciprocal' is not TE's formula: auto keeps the torch reference on CUDA too
    backend_calls["te"].clear()
    list(fp8_weight_stream(tensors, Fp8SyncConfig(family="reciprocal")))
    assert backend_calls["te"] == []
