# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The NVFP4 / MXFP8 refit stream: names, dtypes, shapes, bits (float64 oracle), fused
global scales, exclusions, TP checks, chunked refits, memory bound."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch
from block_format_oracles import mxfp8_oracle, nvfp4_oracle
from pydantic import ValidationError

from nemo_ais.fp8 import NVFP4Tensor, dequantize_nvfp4
from nemo_ais.refit import RefitConfig, plan_refit, refit_stream
from nemo_ais.refit.stream import (
    BlockSyncConfig,
    BlockWeightStream,
    block_weight_stream,
    plan_block_sync,
)

H, FF, Q, KV, V = 64, 96, 64, 32, 100  # hidden, intermediate, q out, kv out, vocab
P = "model.layers.{i}."


def _layer(i: int) -> list[tuple[str, tuple[int, ...]]]:
    p = P.format(i=i)
    return [
        (p + "input_layernorm.weight", (H,)),
        (p + "self_attn.q_proj.weight", (Q, H)),
        (p + "self_attn.q_proj.bias", (Q,)),
        (p + "self_attn.k_proj.weight", (KV, H)),
        (p + "self_attn.v_proj.weight", (KV, H)),
        (p + "self_attn.o_proj.weight", (H, Q)),
        (p + "mlp.gate_proj.weight", (FF, H)),
        (p + "mlp.up_proj.weight", (FF, H)),
        (p + "mlp.down_proj.weight", (H, FF)),
    ]


def _shapes(n_layers: int = 2) -> list[tuple[str, tuple[int, ...]]]:
    shapes = [("model.embed_tokens.weight", (V, H))]
    for i in range(n_layers):
        shapes += _layer(i)
    return [*shapes, ("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]


def _weights(shapes=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for j, (name, shape) in enumerate(shapes or _shapes()):
        scale = 1.0 + j % 3  # shards of one fused layer get different amax
        out.append((name, (scale * torch.randn(shape, generator=g)).to(torch.bfloat16)))
    return out


def _module(name: str) -> str:
    return name.removesuffix(".weight")


def _first_mismatch(got: torch.Tensor, want: np.ndarray) -> str:
    got = got.view(torch.uint8).numpy() if got.dtype != torch.uint8 else got.numpy()
    bad = np.argwhere(got != want)
    return "" if not len(bad) else f"first mismatch at {tuple(bad[0])}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"


def test_nvfp4_names_dtypes_shapes_in_vllm_modelopt_layout():
    weights = _weights()
    out = list(block_weight_stream(weights, BlockSyncConfig()))
    got = {n: (tuple(t.shape), t.dtype) for n, t in out}
    q = P.format(i=0) + "self_attn.q_proj"
    assert got[q + ".weight"] == ((Q, H // 2), torch.uint8)
    assert got[q + ".weight_scale"] == ((Q, H // 16), torch.float8_e4m3fn)
    assert got[q + ".weight_scale_2"] == ((), torch.float32)
    assert q + ".input_scale" not in got  # W4A16: no activation scale
    down = P.format(i=1) + "mlp.down_proj"
    assert got[down + ".weight"] == ((H, FF // 2), torch.uint8)
    assert got[down + ".weight_scale"] == ((H, FF // 16), torch.float8_e4m3fn)
    kept = [n for n, t in out if t.dtype == torch.bfloat16]
    assert kept == [n for n, _ in weights if not n.endswith("proj.weight")]  # embed, norms, bias, lm_head
    for name, tensor in weights:  # kept tensors pass through as the same object
        if name in kept:
            assert next(t for n, t in out if n == name) is tensor


def test_nvfp4_bits_equal_the_float64_oracle_with_the_fused_layers_amax():
    weights = _weights()
    out = dict(block_weight_stream(weights, BlockSyncConfig()))
    w = dict(weights)
    for i in range(2):
        for members in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            names = [f"{P.format(i=i)}{'self_attn' if 'q' in members[0] else 'mlp'}.{m}.weight" for m in members]
            group_amax = max(float(w[n].float().abs().max()) for n in names)
            scales_2 = {float(out[_module(n) + ".weight_scale_2"]) for n in names}
            assert scales_2 == {float(np.float32(group_amax) / np.float32(2688.0))}  # equal over shards
            for n in names:  # each shard: the ModelOpt rule with the group's amax, bit for bit
                data, scale_bytes, _, deq = nvfp4_oracle(w[n].float().numpy(), amax=group_amax)
                assert not _first_mismatch(out[n], data), n + _first_mismatch(out[n], data)
                assert not _first_mismatch(out[_module(n) + ".weight_scale"], scale_bytes), n
                q = NVFP4Tensor(out[n], out[_module(n) + ".weight_scale"], out[_module(n) + ".weight_scale_2"])
                assert np.array_equal(dequantize_nvfp4(q).numpy(), deq), n  # E2M1 x e4m3 x global
    o = P.format(i=0) + "self_attn.o_proj.weight"  # unfused: its own amax
    assert float(out[_module(o) + ".weight_scale_2"]) == float(
        np.float32(float(w[o].float().abs().max())) / np.float32(2688.0)
    )


def test_w4a4_input_scale_is_the_groups_calibrated_amax_over_2688():
    p = P.format(i=0)
    amax = {
        p + "self_attn.qkv_proj": 3.0,  # by fused group
        p + "self_attn.o_proj": 2.0,  # by module
        p + "mlp.gate_proj": 1.0,  # members: max over the group
        p + "mlp.up_proj": 4.0,
        p + "mlp.down_proj": 5.0,
    }
    weights = _weights(_layer(0))
    out = dict(block_weight_stream(weights, BlockSyncConfig(format="nvfp4_w4a4"), input_amax=amax))
    expect = {
        "q_proj": 3.0,
        "k_proj": 3.0,
        "v_proj": 3.0,
        "o_proj": 2.0,
        "gate_proj": 4.0,
        "up_proj": 4.0,
        "down_proj": 5.0,
    }
    for proj, a in expect.items():
        name = next(n for n, _ in weights if n.endswith(f"{proj}.weight"))
        scale = out[_module(name) + ".input_scale"]
        assert scale.dtype == torch.float32 and scale.shape == ()
        assert float(scale) == float(np.float32(a) / np.float32(2688.0)), proj
    with pytest.raises(ValueError, match=r"down_proj.weight: nvfp4_w4a4 needs the calibrated input amax"):
        no_down = {k: v for k, v in amax.items() if "down" not in k}
        list(block_weight_stream(weights, BlockSyncConfig(format="nvfp4_w4a4"), input_amax=no_down))


def test_mxfp8_bits_equal_the_oracle_and_zero_blocks_get_neMo_rls_byte_1():
    weights = _weights(_layer(0))
    name, w = weights[1]  # q_proj
    w[3, 32:64] = 0  # an all-zero block: E8M0 byte 0, NeMo-RL rewrites it to 1
    for zero_byte in (1, 0):
        cfg = BlockSyncConfig(format="mxfp8", mxfp8_zero_scale_byte=zero_byte)
        out = dict(block_weight_stream(weights, cfg))
        for n, t in weights:
            if not n.endswith("proj.weight"):
                continue
            data, scale, _ = mxfp8_oracle(t.float().numpy())
            scale = np.where(scale == 0, np.uint8(zero_byte), scale)
            assert out[n].dtype == torch.float8_e4m3fn and out[n].shape == t.shape
            assert not _first_mismatch(out[n], data), n + _first_mismatch(out[n], data)
            s = out[_module(n) + ".weight_scale"]
            assert s.dtype == torch.uint8 and s.shape == (t.shape[0], t.shape[1] // 32)
            assert not _first_mismatch(s, scale), n
        assert int(out[_module(name) + ".weight_scale"][3, 1]) == zero_byte
        assert not out[name][3, 32:64].view(torch.uint8).any()  # codes 0: the values stay 0
    cfg = BlockSyncConfig(format="mxfp8", mxfp8_scale_name="weight_scale_from_checkpoint")
    names = [n for n, _ in block_weight_stream(weights[1:2], cfg)]
    assert names == [name, _module(name) + ".weight_scale_from_checkpoint"]


def test_exclusions_first_last_layers_patterns_ignore_and_keywords():
    weights = _weights(_shapes(4))

    def quantized(**kwargs):
        cfg = BlockSyncConfig(num_layers=4, **kwargs)
        return {n for n, t in block_weight_stream(weights, cfg) if t.dtype == torch.uint8}

    every = quantized()
    assert len(every) == 7 * 4
    assert quantized(num_first_layers_in_bf16=1, num_last_layers_in_bf16=1) == {
        n for n in every if ".layers.1." in n or ".layers.2." in n
    }
    # NeMo-RL's real_quant_ignore (fnmatch; its default keeps attention in BF16)
    assert quantized(ignore=("*self_attn*",)) == {n for n in every if ".mlp." in n}
    assert quantized(ignore=("layers.0.mlp.*",)) == every - {n for n in every if "layers.0.mlp" in n}
    assert quantized(ignored_layer_kws=("down_proj",)) == {n for n in every if "down" not in n}
    assert quantized(keep_patterns=(r"layers\.3\.",)) == {n for n in every if ".layers.3." not in n}
    plan = plan_block_sync(weights, BlockSyncConfig(num_layers=4, ignore=("*self_attn*",)))
    reasons = {e.name: e.reason for e in plan.entries}
    assert reasons[P.format(i=0) + "self_attn.k_proj.weight"] == "ignore '*self_attn*'"
    assert reasons[P.format(i=0) + "mlp.up_proj.weight"] == "linear projection (nvfp4_w4a16)"


def test_fused_siblings_must_agree_on_quantize_or_keep():
    with pytest.raises(ValueError, match=r"q_proj.weight is quantized but its fused siblings .*k_proj"):
        list(block_weight_stream(_weights(_layer(0)), BlockSyncConfig(ignored_layer_kws=("k_proj",))))


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "nvfp4_w4a16"])
def test_a_pattern_that_keeps_half_a_fused_layer_is_refused_in_every_format(fmt):
    """``mlp.gate`` also matches ``mlp.gate_proj`` (veRL #7519): vLLM's gate_up_proj would hold a BF16 shard."""
    weights = [(f"model.layers.0.mlp.{p}.weight", torch.randn(128, 128)) for p in ("gate_proj", "up_proj")]
    config = RefitConfig(format=fmt, keep_patterns=("mlp.gate",))
    match = r"mlp.up_proj.weight is quantized but its fused siblings \{'model.layers.0.mlp.gate_proj.weight'"
    with pytest.raises(ValueError, match=match):
        list(refit_stream(weights, config))
    with pytest.raises(ValueError, match="fail the TP or fused-sibling check:\n.*" + match):
        plan_refit(weights, config)
    assert {
        e.action for e in plan_refit(weights, RefitConfig(format=fmt, keep_patterns=(r"mlp\.gate\.",))).entries
    } == {"quantize"}  # the router's own name only


def test_tp_shard_of_the_in_dim_must_be_a_multiple_of_the_block():
    weights = _weights(_layer(0))
    with pytest.raises(
        ValueError,
        match=r"o_proj.weight: shape \[64, 64\] with tp_size=8: .* shard of 8, expected a multiple "
        r"of the 16 block",
    ):
        list(block_weight_stream(weights, BlockSyncConfig(tp_size=8)))
    with pytest.raises(
        ValueError, match=r"o_proj.weight: .*tp_size=4: .* shard of 16, expected a multiple of the 32 block"
    ):
        list(block_weight_stream(weights, BlockSyncConfig(format="mxfp8", tp_size=4)))
    list(block_weight_stream(weights, BlockSyncConfig(tp_size=2)))  # 64 / 2, 96 / 2: fine
    q = P.format(i=0) + "self_attn.q_proj.weight"
    with pytest.raises(ValueError, match=r"q_proj.weight: .*column-parallel in dim 1 .* shard of 40, expected a mul"):
        list(block_weight_stream([(q, torch.ones(8, 40))], BlockSyncConfig()))


def test_nan_weight_raises_naming_the_tensor():
    weights = _weights(_layer(0))
    weights[3][1][2, 5] = float("nan")  # k_proj
    with pytest.raises(ValueError, match=r"k_proj.weight: got 1 non-finite value\(s\) .*\(first at index \(2, 5\)"):
        list(block_weight_stream(weights, BlockSyncConfig()))


def test_a_refit_in_chunks_equals_one_stream_even_when_buffers_are_reused():
    weights = _weights(_layer(0))
    want = list(block_weight_stream([(n, t.clone()) for n, t in weights], BlockSyncConfig()))
    stream = BlockWeightStream(BlockSyncConfig())
    got = []
    for chunk in (weights[:4], weights[4:7], weights[7:]):  # q, k | v, o, gate | up, down
        got += [(n, t.clone()) for name, t in chunk for n, t in stream.push(name, t)]
        stream.end_chunk()
        for _, t in chunk:
            t.fill_(7.0)  # the transport reuses its buffer for the next chunk
    stream.close()
    assert [n for n, _ in got] == [n for n, _ in want]
    for (n, a), (_, b) in zip(got, want, strict=True):
        assert torch.equal(a.view(torch.uint8) if a.dim() else a, b.view(torch.uint8) if b.dim() else b), n


def test_unfinished_and_interleaved_fused_layers_are_refused():
    weights = _weights(_layer(0))
    without_v = [(n, t) for n, t in weights if "v_proj" not in n]
    with pytest.raises(ValueError, match=r"self_attn.qkv_proj: got .*q_proj.weight.*missing .*v_proj.weight"):
        list(block_weight_stream(without_v, BlockSyncConfig()))
    layers = _weights(_layer(0) + _layer(1) + _layer(2))
    q_of_each = [(n, t) for n, t in layers if "q_proj.weight" in n]
    with pytest.raises(ValueError, match=r"3 fused layers are open at once .* max_open_groups=2"):
        list(block_weight_stream(q_of_each, BlockSyncConfig()))


def test_moe_experts_per_expert_names_share_gate_up_scales_and_routers_stay_bf16():
    p = P.format(i=0) + "mlp."
    shapes = [(p + "gate.weight", (4, H))]
    for e in range(4):
        shapes += [(f"{p}experts.{e}.{m}.weight", (FF, H)) for m in ("gate_proj", "up_proj")]
        shapes += [(f"{p}experts.{e}.down_proj.weight", (H, FF))]
    out = dict(block_weight_stream(_weights(shapes), BlockSyncConfig()))
    assert out[p + "gate.weight"].dtype == torch.bfloat16  # the router
    for e in range(4):
        g, u = (float(out[f"{p}experts.{e}.{m}.weight_scale_2"]) for m in ("gate_proj", "up_proj"))
        assert g == u  # one w13_weight_scale_2 row [E, 2] with equal columns
    s = {float(out[f"{p}experts.{e}.gate_proj.weight_scale_2"]) for e in range(4)}
    assert len(s) == 4  # but each expert its own


def test_stream_holds_one_fused_layer_and_one_output_at_a_time():
    shapes = _shapes(3)
    inputs, outputs = [], []

    def producer():
        g = torch.Generator().manual_seed(1)
        for name, shape in shapes:
            t = torch.randn(shape, generator=g).to(torch.bfloat16)
            inputs.append(weakref.ref(t))
            yield name, t
            del t

    def live(refs):
        return sum(r() is not None for r in refs)

    max_in, max_out = 0, 0
    for _, t in block_weight_stream(producer(), BlockSyncConfig()):
        if t.dtype != torch.bfloat16:
            outputs.append(weakref.ref(t))
        del t
        max_in, max_out = max(max_in, live(inputs)), max(max_out, live(outputs))
    assert len(outputs) == 3 * 7 * 3
    assert max_out <= 1, f"{max_out} quantized tensors alive at once"
    assert max_in <= 3, f"{max_in} input tensors alive at once (a q/k/v group is 3)"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"format": "nvfp4"}, "format"),
        ({"num_last_layers_in_bf16": 2}, "num_last_layers_in_bf16=2 needs num_layers"),
        ({"keep_patterns": ("(",)}, r"keep_patterns: '\(' is not a valid regex"),
        ({"tp_size": 0}, "tp_size"),
        ({"mxfp8_zero_scale_byte": 2}, "mxfp8_zero_scale_byte"),
        ({"nvfp4_rows_per_block": 8}, "nvfp4_rows_per_block"),
        ({"max_open_groups": 0}, "max_open_groups"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        BlockSyncConfig(**kwargs)


def test_config_is_checked_at_the_call():
    with pytest.raises(TypeError, match="RefitConfig"):
        block_weight_stream([], {"format": "mxfp8"})


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "nvfp4_w4a16"])
def test_a_weight_of_a_dtype_no_quantizer_reads_is_refused_naming_it(fmt):
    """NVFP4 read its amax first: an fp8 weight failed inside torch's aminmax without a name."""
    weights = [("model.layers.0.self_attn.o_proj.weight", torch.randn(64, 64).to(torch.float8_e4m3fn))]
    with pytest.raises(
        ValueError,
        match=rf"^model\.layers\.0\.self_attn\.o_proj\.weight: got \[64, 64\] torch\.float8_e4m3fn, expected a \[\.\.\., K\] floating tensor .* for {fmt}$",
    ):
        list(refit_stream(weights, RefitConfig(format=fmt)))
