# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""MoE expert stacks in the refit stream (``num_experts``): the same pairs, fewer calls.

A small MoE-shaped state dict (2 layers of 4 experts, the experts arriving interleaved
with attention, router and norm tensors) streamed with ``num_experts=4`` gives the same
names and bytes as one expert at a time (the stream without ``num_experts``), for FP8,
MXFP8 and NVFP4 (W4A16, W4A4); one quantizer call per layer and projection; partial
refits, chunks, duplicates and NaN fall back without dropping or delaying a tensor.
"""

from __future__ import annotations

import re

import pytest
import torch

import nemo_ais.formats.fp8_block as fp8_block
import nemo_ais.formats.mxfp8 as mxfp8
import nemo_ais.formats.nvfp4 as nvfp4
from nemo_ais.refit.experts import stack_experts
from nemo_ais.refit.stream import RefitConfig, RefitStream, refit_stream

H, FF, E = 64, 96, 4
FORMATS = ("fp8", "mxfp8", "nvfp4_w4a16", "nvfp4_w4a4")
INPUT_AMAX = {
    **{
        f"model.layers.{i}.mlp.experts.{e}.{m}": 1.0 + e
        for i in range(2)
        for e in range(E)
        for m in ("gate_up_proj", "down_proj")
    },
    **{f"model.layers.{i}.self_attn.qkv_proj": 3.0 for i in range(2)},
    **{f"model.layers.{i}.self_attn.o_proj": 2.0 for i in range(2)},
}


def _state_dict(seed: int = 0, layers: int = 2) -> list[tuple[str, torch.Tensor]]:
    """HF order (per expert: gate, up, down), other tensors in between; experts of different
    scales (a global scale each), gate and up of one expert of different scales."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=1.0):
        return (scale * torch.randn(shape, generator=g)).to(torch.bfloat16)

    out = []
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", torch.ones(H, dtype=torch.bfloat16)),
            (p + "self_attn.q_proj.weight", w(64, H)),
            (p + "self_attn.k_proj.weight", w(32, H, scale=2.0)),
            (p + "self_attn.v_proj.weight", w(32, H)),
            (p + "self_attn.o_proj.weight", w(H, 64)),
            (p + "mlp.gate.weight", w(E, H)),
        ]
        for e in range(E):
            out += [
                (p + f"mlp.experts.{e}.gate_proj.weight", w(FF, H, scale=1.0 + e)),
                (p + f"mlp.experts.{e}.up_proj.weight", w(FF, H, scale=3.0 + e)),
                (p + f"mlp.experts.{e}.down_proj.weight", w(H, FF, scale=0.5)),
            ]
            if e == 1:
                out.append((p + "post_attention_layernorm.weight", torch.ones(H).bfloat16()))
    return out


def _run(fmt: str, tensors, **config) -> dict[str, torch.Tensor]:
    kw = {"input_amax": INPUT_AMAX} if fmt == "nvfp4_w4a4" else {}
    out: dict[str, torch.Tensor] = {}
    for name, t in refit_stream(tensors, RefitConfig(format=fmt, **config), **kw):
        assert name not in out, f"{name} sent twice"
        out[name] = t.clone()
    return out


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert (g.shape, g.dtype) == (w.shape, w.dtype), name
        gb = g.view(torch.uint8) if g.dim() and g.element_size() == 1 else g
        wb = w.view(torch.uint8) if w.dim() and w.element_size() == 1 else w
        assert torch.equal(gb, wb), f"{name}: bytes differ"


@pytest.mark.parametrize("fmt", FORMATS)
def test_stacks_send_the_per_expert_names_and_bytes(fmt):
    want = _run(fmt, _state_dict())
    got = _run(fmt, _state_dict(), num_experts=E)
    _assert_same(got, want)
    experts = [n for n in got if ".experts." in n]
    assert len(experts) == 2 * E * 3 * {"fp8": 2, "mxfp8": 2, "nvfp4_w4a16": 3}.get(fmt, 4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_order_of_arrival_does_not_change_what_is_sent(fmt):
    tensors = _state_dict()
    perm = torch.randperm(len(tensors), generator=torch.Generator().manual_seed(5)).tolist()
    layer0 = [tensors[j] for j in perm if ".layers.0." in tensors[j][0]]
    layer1 = [tensors[j] for j in perm if ".layers.1." in tensors[j][0]]
    _assert_same(_run(fmt, layer0 + layer1, num_experts=E, max_open_groups=20), _run(fmt, _state_dict()))


@pytest.fixture
def quantizer_calls(monkeypatch):
    """Each refit quantizer, wrapped where the format records call it: the expert names it got."""
    calls: list[tuple[str, str]] = []
    for module, fn_name in (
        (fp8_block, "quantize_blockwise"),
        (mxfp8, "quantize_mxfp8"),
        (nvfp4, "quantize_nvfp4"),
        (nvfp4, "quantize_nvfp4_experts"),
    ):
        fn = getattr(module, fn_name)

        def spy(x, *args, _fn=fn, _name=fn_name, **kwargs):
            calls.append((_name, kwargs.get("name", "")))
            return _fn(x, *args, **kwargs)

        monkeypatch.setattr(module, fn_name, spy)
    return calls


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_quantizer_call_per_layer_and_projection(fmt, quantizer_calls):
    _run(fmt, _state_dict(), num_experts=E)
    expert_calls = [c for c in quantizer_calls if ".experts." in c[1]]
    # 2 layers x (gate, up, down): one call each, over the stack of the 4 experts
    assert len(expert_calls) == 2 * 3, expert_calls
    assert all(name.endswith(f"(stack of {E})") for _, name in expert_calls)
    if fmt.startswith("nvfp4"):
        assert {fn for fn, _ in expert_calls} == {"quantize_nvfp4_experts"}
    quantizer_calls.clear()
    _run(fmt, _state_dict())  # without num_experts: one call per expert
    assert len([c for c in quantizer_calls if ".experts." in c[1]]) == 2 * 3 * E


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4_w4a16"])
def test_a_partial_refit_is_sent_whole_with_what_arrived(fmt, quantizer_calls):
    # experts 1 and 3 only, and expert 2's up_proj without its gate_proj (NVFP4: that
    # group stays incomplete, which close() reports, as without stacks)
    keep = [(n, t) for n, t in _state_dict() if not any(f"experts.{e}." in n for e in (0, 2))]
    got = _run(fmt, keep, num_experts=E)
    _assert_same(got, _run(fmt, keep))
    stacked = [c for c in quantizer_calls if "(stack of 2)" in c[1]]
    assert len(stacked) == 2 * 3  # each layer's experts 1 and 3 in one call per projection
    lone = [(n, t) for n, t in _state_dict(layers=1) if "experts.2.gate_proj" not in n]
    if fmt == "fp8":
        _assert_same(_run(fmt, lone, num_experts=E), _run(fmt, lone))
    else:
        with pytest.raises(ValueError, match=r"experts\.2\.gate_up_proj: got .*up_proj.*missing"):
            _run(fmt, lone, num_experts=E)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4_w4a4"])
def test_chunks_with_reused_buffers_and_flush(fmt):
    want = _run(fmt, _state_dict())
    kw = {"input_amax": INPUT_AMAX} if fmt == "nvfp4_w4a4" else {}
    stream = RefitStream(RefitConfig(format=fmt, num_experts=E), **kw)
    tensors = _state_dict()
    got = {}
    for lo, hi in ((0, 9), (9, 20), (20, len(tensors))):  # chunks split expert stacks
        chunk = tensors[lo:hi]
        for name, t in chunk:
            got |= {n: o.clone() for n, o in stream.push(name, t)}
        got |= {n: o.clone() for n, o in stream.flush()}  # what the vLLM hook does
        stream.end_chunk()
        for _, t in chunk:
            t.fill_(7.0)  # the transport reuses its buffers
    stream.close()
    _assert_same(got, want)


def test_close_refuses_stacks_still_held_and_end_chunk_copies_them():
    stream = RefitStream(RefitConfig(format="fp8", num_experts=E))
    t = torch.randn(FF, H).bfloat16()
    name = "model.layers.0.mlp.experts.0.gate_proj.weight"
    assert list(stream.push(name, t)) == []  # held: 3 experts missing
    want = t.clone()
    stream.end_chunk()
    t.fill_(7.0)
    sent = dict(stream.flush())
    ref = dict(refit_stream([(name, want)], RefitConfig(format="fp8")))
    _assert_same(sent, ref)
    assert list(stream.push(name, t)) == []
    with pytest.raises(ValueError, match=r"1 MoE expert weight\(s\) still held .*stream\.flush\(\)"):
        stream.close()


def test_a_duplicate_expert_and_an_index_past_num_experts_are_each_sent():
    tensors = _state_dict(layers=1)
    d = "model.layers.0.mlp.experts.1.down_proj.weight"
    at = [n for n, _ in tensors].index(d) + 1
    second = dict(tensors)[d] * 2
    dup = [*tensors[:at], (d, second), *tensors[at:]]  # while its stack is open
    stream = RefitStream(RefitConfig(format="mxfp8", num_experts=E))
    sent = [(n, o.clone()) for name, t in dup for n, o in stream.push(name, t)]
    sent += [(n, o.clone()) for n, o in stream.flush()]
    stream.close()
    copies = [o for n, o in sent if n == d]
    assert len(copies) == 2  # nothing dropped: the first copy, then the second
    for copy, src in zip(copies, (dict(tensors)[d], second), strict=True):
        _assert_same({d: copy}, {d: _run("mxfp8", [(d, src)])[d]})
    assert sorted({n for n, _ in sent}) == sorted(_run("mxfp8", tensors))
    past = [("model.layers.0.mlp.experts.7.down_proj.weight", torch.randn(H, FF))]
    _assert_same(_run("fp8", past, num_experts=E), _run("fp8", past))


@pytest.mark.parametrize("fmt", ["fp8", "mxfp8", "nvfp4_w4a16"])
def test_nan_in_one_expert_raises_naming_that_expert(fmt):
    tensors = _state_dict(layers=1)
    bad = "model.layers.0.mlp.experts.2.up_proj.weight"
    dict(tensors)[bad][5, 7] = float("nan")
    with pytest.raises(ValueError, match=re.escape(bad) + r": got 1 non-finite.*\(5, 7\)"):
        _run(fmt, tensors, num_experts=E)


def test_experts_kept_in_bf16_leave_the_stack_complete(quantizer_calls):
    tensors = _state_dict(layers=1)
    cfg = {"keep_patterns": (r"experts\.3\.",)}
    got = _run("fp8", tensors, num_experts=E, **cfg)
    _assert_same(got, _run("fp8", tensors, **cfg))
    assert got["model.layers.0.mlp.experts.3.up_proj.weight"].dtype == torch.bfloat16
    assert sum("(stack of 3)" in c[1] for c in quantizer_calls) == 3


def test_stack_experts_is_a_view_of_one_parameter_else_a_copy():
    w = torch.randn(4, 6, 8)
    view = stack_experts([w[e] for e in range(4)])
    assert view.data_ptr() == w.data_ptr() and torch.equal(view, w)
    copied = stack_experts([w[e].clone() for e in range(4)])
    assert copied.data_ptr() != w.data_ptr() and torch.equal(copied, w)
    shuffled = stack_experts([w[1], w[0], w[2], w[3]])
    assert torch.equal(shuffled, w[[1, 0, 2, 3]])


def test_num_experts_is_validated():
    with pytest.raises(ValueError, match="num_experts"):
        RefitConfig(num_experts=0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4_w4a16"])
def test_stacks_through_the_triton_kernels_send_the_pytorch_bytes(fmt, monkeypatch):
    # the Triton path (its interpreter on these CPU tensors): one launch per stack, against
    # one expert at a time on the PyTorch path
    from nemo_ais.formats import dispatch

    monkeypatch.setenv("NEMO_AIS_TRITON", "0")
    want = _run(fmt, _state_dict(layers=1))
    monkeypatch.setenv("NEMO_AIS_TRITON", "1")
    monkeypatch.setattr(dispatch, "_TRITON_DEVICES", ("cuda", "cpu"))
    _assert_same(_run(fmt, _state_dict(layers=1), num_experts=E), want)


def test_a_refit_reuses_the_previous_refits_plans_not_its_errors(monkeypatch):
    """Every step refits the same names: the second stream of an equal config plans nothing
    (Python per tensor was the refit's cost on a GPU, docs/benchmarks.md `refit_scale`),
    sends the same bytes, and a config that differs plans afresh; a failing TP check is
    not cached (it raises again)."""
    import nemo_ais.refit.stream as stream_mod

    calls: list[str] = []
    real = stream_mod._plan_entry
    monkeypatch.setattr(stream_mod, "_plan_entry", lambda name, *a, **k: calls.append(name) or real(name, *a, **k))
    keeps: list[tuple] = []
    real_keep = stream_mod._keep
    monkeypatch.setattr(stream_mod, "_keep", lambda name, *a: keeps.append((name, *a[:1])) or real_keep(name, *a))
    monkeypatch.setattr(stream_mod, "_PLAN_CACHES", type(stream_mod._PLAN_CACHES)())
    tensors = _state_dict()
    first = _run("nvfp4_w4a16", tensors, num_experts=E)
    assert len(calls) == len(tensors)
    # the keep rule runs once per (name, shape) on the first refit, also where an expert
    # stack asked it of a sibling before its plan
    assert len(set(keeps)) == len(keeps)
    assert {name for name, _ in keeps} == {name for name, _ in tensors}
    calls.clear()
    keeps.clear()
    _assert_same(_run("nvfp4_w4a16", tensors, num_experts=E), first)
    assert calls == [] and keeps == []
    _run("nvfp4_w4a16", tensors, num_experts=E, num_first_layers_in_bf16=1)
    assert len(calls) == len(tensors)
    # q_proj's 64 rows over tp_size=2 are no multiple of the 128 block: raises every time
    config = RefitConfig(format="fp8", tp_size=2)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"q_proj\.weight: shape"):
            list(refit_stream(tensors, config))
