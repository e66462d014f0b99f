# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Golden refit bytes: every format's refit stream, pinned by sha256 per stream.

The digests were produced at commit 2599b9d (before the format axis became one record
per format, issue 24) from the code of that commit, and pin what the refit computes: a
change of any name, order, dtype, shape or byte of any refit tensor fails here. Each
digest hashes, in stream order, ``name | dtype | shape | raw bytes`` of every pair the
stream yields for a small fixed-seed state dict (two decoder layers with attention, a
dense MLP, one MoE expert and its router, norms, biases, embeddings and ``lm_head``; one
all-zero block so MXFP8's zero-scale rewrite is exercised). MXFP4 has no refit stream
(no rollout format), so its quantizer output is pinned instead; so is each rollout
format's linear fake quantization (the twin's weights and activations).
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from nemo_ais.fp8 import Fp8SyncConfig, fp8_weight_stream, quantize_mxfp4
from nemo_ais.refit.stream import BlockSyncConfig, block_weight_stream
from nemo_ais.rollout.fake_quant import LINEAR_FAKE_QUANT

H, Q, KV, FF, V, E = 128, 128, 64, 192, 96, 4  # hidden, q out, kv out, ffn, vocab, experts


def _state_dict() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(2599)
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (V, H))]
    for i in range(2):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (H,)),
            (p + "self_attn.q_proj.weight", (Q, H)),
            (p + "self_attn.q_proj.bias", (Q,)),
            (p + "self_attn.k_proj.weight", (KV, H)),
            (p + "self_attn.v_proj.weight", (KV, H)),
            (p + "self_attn.o_proj.weight", (H, Q)),
            (p + "post_attention_layernorm.weight", (H,)),
            (p + "mlp.gate.weight", (E, H)),
            (p + "mlp.shared_expert_gate.weight", (1, H)),
            (p + "mlp.experts.0.gate_proj.weight", (FF, H)),
            (p + "mlp.experts.0.up_proj.weight", (FF, H)),
            (p + "mlp.experts.0.down_proj.weight", (H, FF)),
            (p + "mlp.gate_proj.weight", (FF, H)),
            (p + "mlp.up_proj.weight", (FF, H)),
            (p + "mlp.down_proj.weight", (H, FF)),
        ]
    shapes += [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]
    tensors = []
    for name, shape in shapes:
        t = torch.randn(shape, generator=gen) * 0.05
        if name.endswith("layers.1.mlp.down_proj.weight"):
            t[:, :32] = 0.0  # all-zero 1x32 blocks (MXFP8 zero-scale byte)
        tensors.append((name, t.to(torch.bfloat16)))
    return tensors


def _digest(pairs) -> str:
    h = hashlib.sha256()
    for name, t in pairs:
        t = t.detach().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


_INPUT_AMAX = {
    "model.layers.0.self_attn.qkv_proj": 3.5,
    "model.layers.0.self_attn.o_proj": 2.0,
    "model.layers.0.mlp.experts.0.gate_up_proj": 4.25,
    "model.layers.0.mlp.experts.0.down_proj": 1.5,
    "model.layers.0.mlp.gate_up_proj": 5.0,
    "model.layers.0.mlp.down_proj": 0.75,
    "model.layers.1.self_attn.q_proj": 1.0,
    "model.layers.1.self_attn.k_proj": 6.0,
    "model.layers.1.self_attn.v_proj": 2.0,
    "model.layers.1.self_attn.o_proj": 2.5,
    "model.layers.1.mlp.experts.0.gate_up_proj": 3.0,
    "model.layers.1.mlp.experts.0.down_proj": 1.25,
    "model.layers.1.mlp.gate_up_proj": 7.0,
    "model.layers.1.mlp.down_proj": 0.5,
}

FP8_CASES = {
    "fp8_a": (dict(backend="torch"), "af21c64ed497d1f3df1c0029ff9a440f1cc4f284788bf21978fc4d027398b610"),
    "fp8_b": (
        dict(backend="torch", family="divide"),
        "c3ce9b2ffb723ab316b138da211c7f7980e952218aa19f0c0337ac9bacfbf070",
    ),
    "fp8_c": (
        dict(backend="torch", family="multiplier"),
        "7466437248e65c080c3766ec91cb32f5f665156ab9f8e756c9b9bb20e6868f21",
    ),
    "fp8_a_ue8m0": (
        dict(backend="torch", ue8m0=True),
        "1fd35858c48d53c1cfb4eaf3df11278b036ef02de8f05c6254f0ded0f82696c7",
    ),
    "fp8_first_layer_bf16_keep": (
        dict(backend="torch", num_first_layers_in_bf16=1, keep_patterns=(r"\.o_proj\.",)),
        "dccdcd91dd7f87c19238ea72151fbba57ee83ff99a695bb739f541cde470eab5",
    ),
}

BLOCK_CASES = {
    "nvfp4_w4a16": (dict(format="nvfp4_w4a16"), "b0aae041502e7467d6a9f76de7af67f123fad7690b438fb77a9ae263b790eb91"),
    "nvfp4_w4a16_16x16": (
        dict(format="nvfp4_w4a16", nvfp4_rows_per_block=16),
        "64f59e23b209c60d9c00a71c5692cee13a9a8dd15c1bd8e9fd9e863799641557",
    ),
    "nvfp4_w4a4": (dict(format="nvfp4_w4a4"), "0fa85a154fdb0e6551077f175f57989cb47bdd253b905f6dc8b6b3f2504bb4ac"),
    "nvfp4_w4a16_ignore": (
        dict(format="nvfp4_w4a16", ignore=("*self_attn*",), ignored_layer_kws=("experts",)),
        "4673fbcf1abd40029554259a5edd34b6dd8c3caf8aca38ff0aa30fee02487f29",
    ),
    "mxfp8": (dict(format="mxfp8"), "ae5b8cf46bc78e563da7721d8c74a80b0db1b592919b3b14fb401b739a46af2d"),
    "mxfp8_zero_byte_0_ckpt_name": (
        dict(
            format="mxfp8",
            mxfp8_zero_scale_byte=0,
            mxfp8_scale_name="weight_scale_from_checkpoint",
            num_last_layers_in_bf16=1,
            num_layers=2,
        ),
        "936d74d4eb199ae9701a61f7c883821a97e0ad7da868394d89ebec02d91f8176",
    ),
}

MXFP4_CASES = {
    "mxfp4_ties_even": (False, "241876aa0535d3aeaf5220e3ee7348be0ad6f194794f0afd197f6378b90f3876"),
    "mxfp4_ties_toward_zero": (True, "4aeee4d7f7ce4c2ee64525b608ae1556fdb46473e6e2a583d6d578565246f3bd"),
}


@pytest.mark.parametrize("case", sorted(FP8_CASES))
def test_fp8_refit_stream_bytes_pinned(case: str) -> None:
    kwargs, expected = FP8_CASES[case]
    got = _digest(fp8_weight_stream(_state_dict(), Fp8SyncConfig(**kwargs)))
    assert got == expected, f"{case}: refit digest {got}, pinned {expected}"


@pytest.mark.parametrize("case", sorted(BLOCK_CASES))
def test_block_refit_stream_bytes_pinned(case: str) -> None:
    kwargs, expected = BLOCK_CASES[case]
    config = BlockSyncConfig(**kwargs)
    amax = _INPUT_AMAX if config.format == "nvfp4_w4a4" else None
    got = _digest(block_weight_stream(_state_dict(), config, input_amax=amax))
    assert got == expected, f"{case}: refit digest {got}, pinned {expected}"


@pytest.mark.parametrize("case", sorted(MXFP4_CASES))
def test_mxfp4_quantizer_bytes_pinned(case: str) -> None:
    ties_toward_zero, expected = MXFP4_CASES[case]
    pairs = []
    for name, t in _state_dict():
        if t.ndim == 2 and t.shape[-1] % 32 == 0:
            q = quantize_mxfp4(t, round_ties_toward_zero=ties_toward_zero, name=name)
            pairs += [(name, q.data), (f"{name}.scale", q.scale)]
    got = _digest(pairs)
    assert got == expected, f"{case}: quantizer digest {got}, pinned {expected}"


LINEAR_CASES = {
    "bf16": "7ca5b45fd310393180953ee7031cb12d460d2e314560f3895e03a577d0934418",
    "fp8": "037270573f463eb522c8711cf34ec9b031622218576a85e90bbed789193ef318",
    "mxfp8": "2847d935bea8c418a9291708964e60536db599c8983a82ca850228b9dd156416",
    "nvfp4_w4a16": "4dbf3fba01218394442696c3ac7eea349bcdf8fc5db95932bbb257ebc4dc067f",
    "nvfp4_w4a4": "7469c51cd3a37f753db5dc3fe98f5c36731638273ee465070847ee0a5f906ecb",
}


@pytest.mark.parametrize("fmt", sorted(LINEAR_CASES))
def test_linear_fake_quant_bytes_pinned(fmt: str) -> None:
    """The twin's (and the aligned trainer's) weight and activation fake quantization."""
    fake = LINEAR_FAKE_QUANT[fmt]
    gen = torch.Generator().manual_seed(24)
    w = (torch.randn(FF, H, generator=gen) * 0.05).to(torch.bfloat16)
    x = torch.randn(3, 5, H, generator=gen).to(torch.bfloat16)
    pairs = [
        ("weight", fake.weight(w, amax=torch.tensor(0.2), name="weight")),
        ("input", fake.activation(x, amax=torch.tensor(4.0), name="input")),
    ]
    got = _digest(pairs)
    assert got == LINEAR_CASES[fmt], f"{fmt}: fake-quant digest {got}, pinned {LINEAR_CASES[fmt]}"
