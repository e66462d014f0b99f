# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The FP8 refit seam: pairs, the version-checked patch and the import hook.

Drives NeMo-RL's REAL ``nemo_rl.models.generation.vllm.quantization.fp8`` (its
``load_weights``, ``_is_fp8_weight`` and quantizer; v0.7.0's, and main's with its MXFP8 and
grouped-MoE paths), imported with placeholders for the
few vLLM names it imports at load (``tests/_vllm_boundary.py``; vLLM is not installable
here). The patch is installed on that module exactly as in a vLLM worker.
"""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
from _vllm_boundary import MXFP8_QUANTIZED, LinearBase, RoutedExperts, import_upstream_fp8
from nemo_rl_version import NEMO_RL
from torch import nn

from nemo_ais.fp8 import Fp8SyncConfig, quantize_blockwise, quantize_mxfp8
from nemo_ais.nemo_rl import refit
from nemo_ais.refit.stream import RefitStream
from nemo_ais.rules.format_geometry import GEOMETRY

pytestmark = pytest.mark.nemo_rl

CONFIG = Fp8SyncConfig()
Q = "model.layers.0.self_attn.q_proj.weight"
NORM = "model.layers.0.input_layernorm.weight"


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (Q, torch.randn(256, 200, generator=g, dtype=torch.float32).to(torch.bfloat16)),
        (NORM, torch.ones(200, dtype=torch.bfloat16)),
    ]


def test_refit_pairs_quantize_engine_fp8_tensors_only():
    weights = _weights()
    pairs = list(refit.refit_pairs(weights, lambda name: name == Q, CONFIG))
    assert [n for n, _ in pairs] == [Q, Q.removesuffix(".weight") + ".weight_scale_inv", NORM]
    q_ref, s_ref = quantize_blockwise(weights[0][1])
    assert pairs[0][1].dtype == torch.float8_e4m3fn
    assert torch.equal(pairs[0][1].view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(pairs[1][1], s_ref) and pairs[1][1].shape == (2, 2)
    assert pairs[2][1] is weights[1][1]  # BF16 tensors pass through untouched


def test_refit_pairs_refuse_layout_disagreement_and_nan():
    with pytest.raises(ValueError, match=rf"{NORM}: the vLLM engine holds it in fp8"):
        list(refit.refit_pairs(_weights(), lambda name: True, CONFIG))
    bad = _weights()
    bad[0][1][3, 5] = float("nan")
    with pytest.raises(ValueError, match="q_proj"):
        list(refit.refit_pairs(bad, lambda name: name == Q, CONFIG))


@pytest.fixture
def upstream_fp8(monkeypatch):
    """NeMo-RL v0.7.0's real ``quantization/fp8.py`` (vLLM names: placeholders)."""
    yield from import_upstream_fp8(monkeypatch)


class _VllmModel(nn.Module):
    """The module tree of a vLLM Qwen2/Llama layer as upstream's ``_is_fp8_weight`` walks it.

    ``qkv_proj`` is a (placeholder) ``LinearBase`` whose weight the engine holds in FP8; the
    layernorm is not a linear layer. ``load_weights`` records what the refit streams.
    """

    def __init__(self):
        super().__init__()
        self.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
        attn = nn.Module()
        attn.qkv_proj = LinearBase()
        attn.qkv_proj.weight = nn.Parameter(torch.zeros(768, 200).to(torch.float8_e4m3fn), requires_grad=False)
        layer = nn.Module()
        layer.self_attn = attn
        layer.input_layernorm = nn.Module()
        layer.input_layernorm.weight = nn.Parameter(torch.ones(200, dtype=torch.bfloat16))
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([layer])
        self.loaded = []

    def load_weights(self, weights):
        self.loaded = [(n, t) for n, t in weights]  # consumes the stream


def test_real_upstream_module_has_the_recorded_signatures(upstream_fp8):
    refit.check_signatures(upstream_fp8)  # raises on any difference


@pytest.fixture
def quantizers(upstream_fp8, monkeypatch):
    """Spies on both quantizers: names that went through ours / through upstream's."""
    seen = {"ours": [], "upstream": []}
    ours, theirs = RefitStream.push, upstream_fp8.cast_tensor_to_fp8_blockwise

    def spy_ours(stream, name, tensor):
        seen["ours"].append(name)
        return ours(stream, name, tensor)

    def spy_theirs(data_hp, weight_block_size):
        seen["upstream"].append(tuple(data_hp.shape))
        return theirs(data_hp, weight_block_size)

    monkeypatch.setattr(RefitStream, "push", spy_ours)
    monkeypatch.setattr(upstream_fp8, "cast_tensor_to_fp8_blockwise", spy_theirs)
    return seen


def test_install_patches_upstreams_module_once_and_streams_into_vllm(upstream_fp8, quantizers):
    upstream_fp8.global_fp8_config = upstream_fp8.FP8Config()
    theirs = types.SimpleNamespace(model=_VllmModel())
    upstream_fp8.load_weights(_weights(), theirs)  # NeMo-RL's own quantizer, for the layout
    assert quantizers == {"ours": [], "upstream": [(256, 200)]}  # unpatched: upstream's
    assert refit.install(upstream_fp8, CONFIG) is True
    assert refit.install(upstream_fp8, CONFIG) is False  # idempotent
    ours = types.SimpleNamespace(model=_VllmModel())
    upstream_fp8.load_weights(_weights(), ours)
    # patched: the FP8 linear weight went through nemo_ais.fp8 only, nothing else did
    assert quantizers == {"ours": [Q], "upstream": [(256, 200)]}
    # upstream's real _is_fp8_weight picked the FP8 tensors: same names, shapes and dtypes
    assert [(n, t.shape, t.dtype) for n, t in ours.model.loaded] == [
        (n, t.shape, t.dtype) for n, t in theirs.model.loaded
    ]
    assert [n for n, _ in ours.model.loaded] == [Q, Q.removesuffix(".weight") + ".weight_scale_inv", NORM]
    q_ref, s_ref = quantize_blockwise(_weights()[0][1])
    assert torch.equal(ours.model.loaded[0][1].view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(ours.model.loaded[1][1], s_ref)
    assert ours.model.loaded[2][1].dtype == torch.bfloat16  # BF16 tensors pass through


def test_family_c_refit_equals_upstreams_quantizer_bit_for_bit(upstream_fp8):
    # NeMo-RL scales by m = 448 / amax and stores 1 / m: our family multiplier, the shipped default.
    upstream_fp8.global_fp8_config = upstream_fp8.FP8Config()
    w = torch.randn(256, 384, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    q_up, s_up = upstream_fp8.cast_tensor_to_fp8_blockwise(w.to(torch.float), [128, 128])
    q, s = quantize_blockwise(w, family="multiplier")
    assert torch.equal(q.view(torch.uint8), q_up.view(torch.uint8))
    assert torch.equal(s, torch.squeeze(s_up, dim=-1))


def _moe_model(fp8_experts: bool) -> _VllmModel:
    """``_VllmModel`` plus a grouped-expert MoE layer (vLLM 0.25's ``RoutedExperts``)."""
    model = _VllmModel()
    dtype = torch.float8_e4m3fn if fp8_experts else torch.bfloat16
    experts = RoutedExperts()
    experts.w13_weight = nn.Parameter(torch.zeros(2, 256, 128).to(dtype), requires_grad=False)
    experts.w2_weight = nn.Parameter(torch.zeros(2, 128, 128).to(dtype), requires_grad=False)
    model.model.layers[0].mlp = nn.Module()
    model.model.layers[0].mlp.experts = experts
    return model


GROUPED = "model.layers.0.mlp.experts.gate_up_proj"  # [experts, 2 x intermediate, hidden]


@pytest.mark.parametrize("fp8_experts", [True, False])
def test_grouped_moe_experts_are_delegated_to_upstream(upstream_fp8, fp8_experts):
    # main expands grouped expert slabs into per-expert FP8 (or passes them through for
    # BF16 experts); the AIS refit quantizes linear weights only and must leave that to it.
    # v0.7.0 has no grouped-expert path: it passes the slab through, and so do we.
    upstream_fp8.global_fp8_config = upstream_fp8.FP8Config()
    slab = torch.randn(2, 256, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    weights = [*_weights(), (GROUPED, slab)]
    theirs = types.SimpleNamespace(model=_moe_model(fp8_experts))
    upstream_fp8.load_weights(weights, theirs)
    assert refit.install(upstream_fp8, CONFIG) is True
    ours = types.SimpleNamespace(model=_moe_model(fp8_experts))
    upstream_fp8.load_weights(weights, ours)
    names = [n for n, _ in ours.model.loaded]
    assert names == [n for n, _ in theirs.model.loaded]
    experts = [(n, t) for n, t in ours.model.loaded if ".mlp.experts" in n]
    if fp8_experts and NEMO_RL == "main":  # per-expert FP8: gate/up of experts 0, 1 + scales
        assert [n for n, _ in experts] == [
            f"model.layers.0.mlp.experts.{e}.{p}.weight{s}"
            for p in ("gate_proj", "up_proj")
            for e in (0, 1)
            for s in ("", "_scale_inv")
        ]
    else:  # BF16 experts (or v0.7.0): the slab as it came
        assert experts == [(GROUPED, slab)]
    for (name, got), (_, want) in zip(experts, [(n, t) for n, t in theirs.model.loaded if
                                                 ".mlp.experts" in n], strict=True):  # fmt: skip
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), name
    # the linear weight is still ours
    q_ref, _ = quantize_blockwise(_weights()[0][1])
    assert torch.equal(ours.model.loaded[0][1].view(torch.uint8), q_ref.view(torch.uint8))


def test_mxfp8_refit_is_delegated_to_upstream_and_its_bits_are_nvidias_rule(upstream_fp8):
    # main's is_mx: MXFP8 (32-element E8M0 blocks, ``*_scale_from_checkpoint``) is not what
    # the FP8 patch quantizes: the whole stream goes to upstream's quantize_mxfp8_weight,
    # whose vLLM kernel stand-in is the float64 oracle (tests/_vllm_boundary.py)
    if NEMO_RL == "v0.7.0":  # v0.7.0 has no MXFP8 refit: its FP8Config has no is_mx
        with pytest.raises(TypeError, match="is_mx"):
            upstream_fp8.FP8Config(is_mx=True)
        return
    upstream_fp8.global_fp8_config = upstream_fp8.FP8Config(is_mx=True)
    assert refit.install(upstream_fp8, CONFIG) is True
    runner = types.SimpleNamespace(model=_VllmModel())
    weight = torch.randn(256, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    weight[5, 64:96] = 0  # an all-zero block: the kernel's byte 0, NeMo-RL's byte 1
    weight[7, :32] *= 300  # a block whose max significand > 1.75 (NVIDIA's ceil != OCP)
    upstream_fp8.load_weights([(Q, weight), _weights()[1]], runner)
    loaded = runner.model.loaded
    assert [n for n, _ in loaded] == [Q, Q + "_scale_from_checkpoint", NORM]
    assert len(MXFP8_QUANTIZED) == 1 and MXFP8_QUANTIZED[0] is weight  # vLLM's quantizer
    data, scale = loaded[0][1], loaded[1][1]
    assert (data.dtype, data.shape) == (torch.float8_e4m3fn, (256, 256))
    assert (scale.dtype, scale.shape) == (torch.uint8, (256, 8))
    want = quantize_mxfp8(weight)  # nemo_ais.fp8's MXFP8, bit-equal to the oracle
    assert torch.equal(data.view(torch.uint8), want.data.view(torch.uint8))
    assert int(want.scale[5, 2]) == 0 and int(scale[5, 2]) == 1  # upstream's 0 -> 1 rewrite
    assert torch.equal(scale, want.scale.masked_fill(want.scale == 0, 1))


def test_install_refuses_a_changed_upstream_signature(upstream_fp8, monkeypatch):
    def load_weights(weights, model_runner, extra=None):  # what a future NeMo-RL might ship
        raise AssertionError("not called")

    monkeypatch.setattr(upstream_fp8, "load_weights", load_weights)
    with pytest.raises(RuntimeError, match=r"load_weights: signature .*recorded \(weights, mo"):
        refit.install(upstream_fp8, CONFIG)
    assert upstream_fp8.load_weights is load_weights  # left unpatched


def test_import_hook_patches_upstreams_module_on_first_import(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    refit.install_on_import(CONFIG)  # target: NeMo-RL's real module, not imported yet
    assert refit.TARGET_MODULE not in sys.modules
    fp8 = next(import_upstream_fp8(monkeypatch))  # what the vLLM worker's import does
    assert getattr(fp8.load_weights, "__nemo_ais_refit__", False)
    seen = []
    ours = RefitStream.push

    def spy(stream, name, tensor):  # our quantizer, recording what it is given
        seen.append(name)
        return ours(stream, name, tensor)

    monkeypatch.setattr(RefitStream, "push", spy)
    monkeypatch.setattr(fp8, "cast_tensor_to_fp8_blockwise", _never_called)
    fp8.global_fp8_config = fp8.FP8Config()
    runner = types.SimpleNamespace(model=_VllmModel())
    fp8.load_weights(_weights(), runner)
    assert seen == [Q]  # the hook's patch quantized it, upstream's did not
    assert [n for n, _ in runner.model.loaded] == [Q, Q.removesuffix(".weight") + ".weight_scale_inv", NORM]
    sys.modules.pop(refit.TARGET_MODULE, None)


def _never_called(*args, **kwargs):
    raise AssertionError("upstream's quantizer ran: the AIS refit patch is not active")


def test_config_round_trips_through_the_environment():
    env = {refit.ENV_VAR: Fp8SyncConfig(tp_size=2, ue8m0=True).model_dump_json()}
    assert refit.config_from_env(env) == Fp8SyncConfig(tp_size=2, ue8m0=True)
    assert refit.config_from_env({}) is None
    assert json.loads(env[refit.ENV_VAR])["tp_size"] == 2


def _launcher():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "launchers" / "run_grpo_ais.py"
    spec = importlib.util.spec_from_file_location("run_grpo_ais_refit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # top level imports nemo_ais only (no NeMo-RL)
    return module


def test_launcher_arms_the_hook_only_for_fp8_rollouts():
    run = _launcher()
    fp8 = {"policy": {"generation": {"vllm_cfg": {"precision": "fp8", "tensor_parallel_size": 4}}}}
    env = {"PYTHONPATH": "/x"}
    assert run.configure_fp8_refit(fp8, env) is None  # no section: NeMo-RL's quantizer
    assert env == {"PYTHONPATH": "/x"}
    cfg = run.configure_fp8_refit({**fp8, "ais_fp8_refit": {"ue8m0": True}}, env)
    assert cfg == Fp8SyncConfig(tp_size=4, ue8m0=True)  # TP size taken from vllm_cfg
    assert refit.config_from_env(env) == cfg
    hook = env["PYTHONPATH"].split(":")[0]
    assert hook.endswith("nemo_ais/nemo_rl/_vllm_hook")
    assert (run.REPO_ROOT / "nemo_ais/nemo_rl/_vllm_hook/sitecustomize.py").exists()
    bf16 = {"policy": {"generation": {"vllm_cfg": {"precision": "bfloat16"}}}}
    with pytest.raises(ValueError, match=r"needs policy\.generation\.vllm_cfg\.precision: fp8"):
        run.configure_fp8_refit({**bf16, "ais_fp8_refit": {}}, {})
    with pytest.raises(ValueError, match=r"ais_fp8_refit\.famly is not a known field"):
        run.configure_fp8_refit({**fp8, "ais_fp8_refit": {"famly": "a"}}, {})
    assert run.configure_fp8_refit({**fp8, "ais_fp8_refit": {"enabled": False}}, {}) is None


def test_the_fp8_refit_block_is_the_engines(upstream_fp8):
    # the engine's weight_scale_inv is [N/128, K/128]: a [64, 64] block once streamed [N/64, K/64] scales,
    # which vLLM's loader refused at the first refit, inside the engine
    run = _launcher()
    fp8 = {"policy": {"generation": {"vllm_cfg": {"precision": "fp8"}}}}
    assert GEOMETRY["fp8"].block == tuple(upstream_fp8.FP8_BLOCK_QUANT_KWARGS["weight_block_size"])
    assert run.configure_fp8_refit({**fp8, "ais_fp8_refit": {"block": [128, 128]}}, {}).block == (128, 128)
    with pytest.raises(ValueError, match=r"ais_fp8_refit\.block=\[64, 64\] is invalid: expected \[128, 128\]"):
        run.configure_fp8_refit({**fp8, "ais_fp8_refit": {"block": [64, 64]}}, {})


def test_backend_auto_is_decided_once_per_process_not_per_tensor(upstream_fp8, monkeypatch):
    # backend: auto used to ask te_backend.use_te (and try to import Transformer Engine)
    # for every tensor of every refit: ~18k times per Qwen3-30B refit
    from nemo_ais.fp8 import te_backend

    asked = []
    real = te_backend.use_te

    def spy(x, backend, **kwargs):
        asked.append((backend, x.numel()))
        return real(x, backend, **kwargs)

    monkeypatch.setattr(te_backend, "use_te", spy)
    upstream_fp8.global_fp8_config = upstream_fp8.FP8Config()
    assert CONFIG.backend == "auto"
    assert refit.install(upstream_fp8, CONFIG) is True
    for _ in range(3):  # three refits
        runner = types.SimpleNamespace(model=_VllmModel())
        upstream_fp8.load_weights(_weights(), runner)
        q_ref, _ = quantize_blockwise(_weights()[0][1])  # no TE here: the torch reference
        assert torch.equal(runner.model.loaded[0][1].view(torch.uint8), q_ref.view(torch.uint8))
    assert asked == [("auto", 0)]  # once, at install, on an empty probe tensor
    assert refit.decide_backend(CONFIG).backend == "torch"  # CPU: no TE


K = "model.layers.0.self_attn.k_proj.weight"


def test_the_hook_takes_head_dim_from_the_engine_so_replicated_kv_heads_refit(upstream_fp8):
    """2 KV heads of 128 at vLLM TP 4: vLLM gives each rank one whole head (replicated), a 128-row shard. Without
    head_dim the shard check took 256 / 4 = 64 rows and refused the first refit; the hook now reads the head dim
    from the engine's model config (vLLM's ``ModelConfig.get_head_size()``)."""
    upstream_fp8.global_fp8_config = upstream_fp8.FP8Config()
    assert refit.engine_head_dim(types.SimpleNamespace()) is None
    assert refit.install(upstream_fp8, Fp8SyncConfig(tp_size=4)) is True
    k = torch.randn(256, 200, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    bare = types.SimpleNamespace(model=_VllmModel())  # a runner without a model config: the old behaviour
    with pytest.raises(ValueError, match=r"shard of 64, .* \(or set head_dim: vLLM replicates KV heads"):
        upstream_fp8.load_weights([(K, k)], bare)
    runner = types.SimpleNamespace(model=_VllmModel(), model_config=types.SimpleNamespace(get_head_size=lambda: 128))
    assert refit.engine_head_dim(runner) == 128
    upstream_fp8.load_weights([(K, k)], runner)
    q_ref, s_ref = quantize_blockwise(k)
    assert [n for n, _ in runner.model.loaded] == [K, K.removesuffix(".weight") + ".weight_scale_inv"]
    assert torch.equal(runner.model.loaded[0][1].view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(runner.model.loaded[1][1], s_ref)
