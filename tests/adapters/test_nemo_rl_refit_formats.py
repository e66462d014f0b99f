# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The NVFP4 / MXFP8 refit of a BF16 trainer through NeMo-RL's REAL code, only vLLM stubbed.

NeMo-RL functions driven, per ``--nemo-rl`` version:

* both: ``models/generation/vllm/quantization/fp8.py`` -- ``load_weights``, ``is_fp8_model``,
  ``_is_fp8_weight``, ``_get_module_from_param_name`` (the refit hook is installed on the
  module as in a vLLM worker); ``modelopt/utils.py`` -- ``DEFAULT_NVFP4_IGNORE``,
  ``matches_quant_ignore_pattern`` (v0.7.0 also ``build_vllm_modelopt_nvfp4_config``).
* main: ``fp8.py``'s MXFP8 path (``load_weights`` with ``is_mx``, ``quantize_mxfp8_weight``);
  ``modelopt/models/generation/vllm_modelopt.py`` -- ``_canonicalize_nvfp4_scale_``,
  ``_load_modelopt_moe_input_scale`` and, from ``register_nemo_modelopt_nvfp4``, the W4A16
  linear and MoE methods' ``process_weights_after_loading`` and the W4A4 MoE method's
  ``create_weights`` (which binds that input-scale loader).
* v0.7.0: ``modelopt/models/generation/vllm_modelopt_patch.py`` --
  ``_modelopt_dense_process_w4a16_weights`` and ``_modelopt_dense_process_weights`` (W4A4).

Stubbed, and recorded: vLLM's modules (``tests/_vllm_boundary.py``; its MXFP8 kernel is
the float64 oracle), vLLM's quant-config / quant-method base classes (name-alikes),
Marlin's ``prepare_fp4_layer_for_marlin`` and the NVFP4 kernels (they record the layer
they receive), and vLLM's fused weight loaders (:func:`_fused_linear`, :func:`_fused_moe`
stack the streamed shards as vLLM's loaders do).
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from _vllm_boundary import (
    MXFP8_QUANTIZED,
    FusedMoE,
    LinearBase,
    RoutedExperts,
    import_upstream_fp8,
    install_vllm_placeholders,
)
from nemo_rl_version import NEMO_RL
from torch import nn
from torch.nn import Parameter

from nemo_ais.fp8 import NVFP4Tensor, dequantize_nvfp4, quantize_nvfp4
from nemo_ais.nemo_rl import refit
from nemo_ais.refit.stream import BlockSyncConfig, Fp8SyncConfig, block_weight_stream, plan_tensor
from nemo_ais.rules.keep_bf16 import KeepInBf16

pytestmark = pytest.mark.nemo_rl

H, FF, Q, KV, E = 64, 96, 64, 32, 4  # hidden, intermediate, q out, kv out, experts
L0 = "model.layers.0."
QKV = [f"{L0}self_attn.{p}_proj" for p in "qkv"]
GATE_UP = [f"{L0}mlp.{p}_proj" for p in ("gate", "up")]
NORM = L0 + "input_layernorm.weight"
REPO = Path(__file__).resolve().parents[2]


# --- vLLM name-alikes: the hook matches vLLM's ModelOpt classes by name, never imports them
class ModelOptNvFp4Config:
    """Stand-in of vLLM's ModelOpt NVFP4 quant config."""

    @classmethod
    def from_config(cls, config):
        return cls()

    @classmethod
    def _extract_modelopt_quant_algo(cls, config):
        return config.get("quant_algo")


class ModelOptNvFp4LinearMethod:
    """Stand-in of vLLM's ModelOpt NVFP4 linear method."""

    def __init__(self, quant_config=None):
        self.quant_config = quant_config

    def create_weights(self, layer, *args, **kwargs):
        layer.input_scale = Parameter(torch.zeros(1), requires_grad=False)


class ModelOptNvFp4FusedMoE:
    """Stand-in of vLLM's ModelOpt NVFP4 MoE method: creates the input scales, records."""

    processed: ClassVar[list[dict[str, torch.Tensor]]] = []

    def __init__(self, *args, **kwargs):
        self.moe_kernel, self.moe_quant_config = None, None
        self.nvfp4_backend = NvFp4MoeBackend.MARLIN

    def create_weights(self, layer, num_experts, hidden_size, intermediate, params_dtype, **kw):
        layer.w13_input_scale = Parameter(torch.zeros(num_experts, 2), requires_grad=False)
        layer.w2_input_scale = Parameter(torch.zeros(num_experts), requires_grad=False)

    def process_weights_after_loading(self, layer):
        self.processed.append({k: v.detach().clone() for k, v in layer.named_parameters()})


class UnquantizedLinearMethod:
    """Stand-in of vLLM's BF16 linear method (a layer the engine keeps in BF16)."""


class Fp8Config:
    """Stand-in of vLLM's block-FP8 quant config."""

    weight_block_size = (128, 128)


class ModelOptMxFp8Config:
    """Stand-in of vLLM's ModelOpt MXFP8 quant config (main)."""


class NvFp4MoeBackend(enum.Enum):
    """Stand-in of vLLM 0.25's NVFP4 MoE backend enum."""

    MARLIN = "marlin"
    CUTLASS = "cutlass"


class _RecordingKernel:
    """Stand-in of Marlin's NVFP4 linear kernel: records the layer it converts."""

    seen: ClassVar[list[dict[str, torch.Tensor]]] = []

    def __init__(self, *args):
        pass

    def process_weights_after_loading(self, layer):
        self.seen.append({k: v.detach().clone() for k, v in layer.named_parameters()})


def _stub(monkeypatch, leaves: dict[str, dict]) -> None:
    """vLLM placeholder leaves (after the boundary's), with missing parent packages."""
    for name, attrs in leaves.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in sys.modules:
                monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
                sys.modules[parent].__path__ = []
        module = sys.modules.get(name)
        if module is None:
            module = types.ModuleType(name)
            module.__path__ = []
            monkeypatch.setitem(sys.modules, name, module)
        for key, value in attrs.items():
            monkeypatch.setattr(module, key, value, raising=False)


@pytest.fixture
def upstream_fp8(monkeypatch):
    """NeMo-RL's real ``quantization/fp8.py`` plus the vLLM quant configs it imports lazily."""
    modules = import_upstream_fp8(monkeypatch)
    module = next(modules)
    _stub(
        monkeypatch,
        {
            "vllm.model_executor.layers.quantization.fp8": {"Fp8Config": Fp8Config},
            "vllm.model_executor.layers.quantization.modelopt": {"ModelOptMxFp8Config": ModelOptMxFp8Config},
        },
    )
    yield module
    next(modules, None)


# --- the engine side: a vLLM module tree and the refit stream a BF16 trainer sends
def _linear(out: int, k: int, fmt: str) -> LinearBase:
    layer = LinearBase()
    if fmt == "nvfp4":
        layer.quant_method = ModelOptNvFp4LinearMethod()
        weight = torch.zeros(out, k // 2, dtype=torch.uint8)
    elif fmt == "mxfp8":
        layer.quant_method = None
        weight = torch.zeros(out, k).to(torch.float8_e4m3fn)
    else:
        layer.quant_method = UnquantizedLinearMethod()
        weight = torch.zeros(out, k, dtype=torch.bfloat16)
    layer.weight = Parameter(weight, requires_grad=False)
    return layer


class _Engine(nn.Module):
    """A vLLM Qwen-like layer as upstream's ``_get_module_from_param_name`` walks it.

    ``load_weights`` records every pair the refit streams (over all refit chunks).
    """

    def __init__(self, fmt: str, attention: str | None = None, moe: bool = False):
        super().__init__()
        self.packed_modules_mapping = {
            "qkv_proj": ["q_proj", "k_proj", "v_proj"],
            "gate_up_proj": ["gate_proj", "up_proj"],
        }
        attn = nn.Module()
        attn.qkv_proj = _linear(Q + 2 * KV, H, attention or fmt)
        attn.o_proj = _linear(H, Q, attention or fmt)
        mlp = nn.Module()
        if moe:
            experts = (RoutedExperts if NEMO_RL == "main" else FusedMoE)()
            experts.quant_method = ModelOptNvFp4FusedMoE()
            experts.w13_weight = Parameter(torch.zeros(E, 2 * FF, H // 2, dtype=torch.uint8), requires_grad=False)
            experts.w2_weight = Parameter(torch.zeros(E, H, FF // 2, dtype=torch.uint8), requires_grad=False)
            mlp.experts = experts
            mlp.gate = _linear(E, H, "bf16")
        else:
            mlp.gate_up_proj = _linear(2 * FF, H, fmt)
            mlp.down_proj = _linear(H, FF, fmt)
        layer = nn.Module()
        layer.self_attn, layer.mlp = attn, mlp
        layer.input_layernorm = nn.Module()
        layer.input_layernorm.weight = Parameter(torch.ones(H, dtype=torch.bfloat16))
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([layer])
        self.loaded: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights):
        self.loaded += [(n, t.clone()) for n, t in weights]  # consumes the stream


def _runner(engine: _Engine, quant_config) -> types.SimpleNamespace:
    return types.SimpleNamespace(model=engine, vllm_config=types.SimpleNamespace(quant_config=quant_config))


def _hf_weights(seed: int = 0, moe: bool = False) -> list[tuple[str, torch.Tensor]]:
    """A BF16 trainer's refit of layer 0, unfused HF names, in Megatron-Bridge order."""
    shapes = [(NORM, (H,))]
    shapes += [(f"{m}.weight", (Q if m.endswith("q_proj") else KV, H)) for m in QKV]
    shapes += [(f"{L0}self_attn.o_proj.weight", (H, Q))]
    if moe:
        shapes += [(f"{L0}mlp.gate.weight", (E, H))]
        for e in range(E):
            shapes += [(f"{L0}mlp.experts.{e}.{p}.weight", (FF, H)) for p in ("gate_proj", "up_proj")]
            shapes += [(f"{L0}mlp.experts.{e}.down_proj.weight", (H, FF))]
    else:
        shapes += [(f"{m}.weight", (FF, H)) for m in GATE_UP] + [(f"{L0}mlp.down_proj.weight", (H, FF))]
    g = torch.Generator().manual_seed(seed)
    return [(n, ((1 + j % 3) * torch.randn(s, generator=g)).to(torch.bfloat16)) for j, (n, s) in enumerate(shapes)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dim() and t.element_size() == 1 else t


def _assert_same_pairs(got, want):
    assert [n for n, _ in got] == [n for n, _ in want]
    for (name, a), (_, b) in zip(got, want, strict=True):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), name
        assert torch.equal(_bits(a), _bits(b)), name


# --- the hook on upstream's real refit module
def test_block_hook_is_installed_through_the_fp8_seam_with_its_recorded_signatures(upstream_fp8):
    refit.check_signatures(upstream_fp8, refit.ENGINES["nvfp4"].signatures)  # raises on any difference, both versions
    assert refit.install(upstream_fp8, BlockSyncConfig()) is True
    assert refit.install(upstream_fp8, BlockSyncConfig()) is False  # idempotent
    assert refit.hook_status().patched


def test_nvfp4_refit_in_chunks_loads_what_the_stream_yields(upstream_fp8):
    runner = _runner(_Engine("nvfp4"), ModelOptNvFp4Config())
    # upstream routes an NVFP4 engine's refit straight to model.load_weights (BF16 into uint8)
    assert upstream_fp8.is_fp8_model(runner.vllm_config) is False
    assert refit.install(upstream_fp8, BlockSyncConfig()) is True
    assert upstream_fp8.is_fp8_model(runner.vllm_config) is True  # now to our load_weights
    assert upstream_fp8.is_fp8_model(types.SimpleNamespace(quant_config=Fp8Config())) is True
    assert upstream_fp8.is_fp8_model(types.SimpleNamespace(quant_config=None)) is False
    weights = _hf_weights()
    want = list(block_weight_stream([(n, t.clone()) for n, t in weights], BlockSyncConfig()))
    for chunk in (weights[:3], weights[3:6], weights[6:]):  # q, k | v, o, gate | up, down
        upstream_fp8.load_weights(chunk, runner)
        for _, t in chunk:
            t.fill_(7.0)  # IPC / broadcast buffers are reused for the next chunk
    _assert_same_pairs(runner.model.loaded, want)
    names = [n for n, _ in runner.model.loaded]
    assert names[:4] == [NORM, *(f"{QKV[0]}.weight{s}" for s in ("", "_scale", "_scale_2"))]
    loaded = dict(runner.model.loaded)
    scales_2 = {float(loaded[f"{m}.weight_scale_2"]) for m in QKV}
    assert len(scales_2) == 1  # q, k, v: one global scale, so vLLM's max over them loses nothing


def test_nvfp4_engine_layout_decides_and_must_agree_with_the_exclusions(upstream_fp8):
    # the engine keeps attention in BF16 (NeMo-RL's default real_quant_ignore does)
    runner = _runner(_Engine("nvfp4", attention="bf16"), ModelOptNvFp4Config())
    assert refit.install(upstream_fp8, BlockSyncConfig(ignore=("*self_attn*",))) is True
    weights = _hf_weights()
    upstream_fp8.load_weights(weights, runner)
    dtypes = {n: t.dtype for n, t in runner.model.loaded}
    assert all(dtypes[f"{m}.weight"] == torch.bfloat16 for m in QKV)  # passed through
    assert dtypes[f"{GATE_UP[0]}.weight"] == torch.uint8
    # the engine holds attention in NVFP4 but the stream would keep it: refused, named
    engine = _Engine("nvfp4")
    with pytest.raises(
        ValueError, match=r"q_proj.weight: the vLLM engine holds it in nvfp4_w4a16 but .*ignore '\*self_attn\*'"
    ):
        upstream_fp8.load_weights(weights, _runner(engine, ModelOptNvFp4Config()))
    with pytest.raises(RuntimeError, match=r"format=nvfp4_w4a16 but the vLLM engine's quant config is Fp8Config"):
        upstream_fp8.load_weights(weights, _runner(_Engine("nvfp4"), Fp8Config()))


def test_nvfp4_moe_per_expert_refit_and_grouped_slabs_refused(upstream_fp8):
    runner = _runner(_Engine("nvfp4", moe=True), ModelOptNvFp4Config())
    assert refit.install(upstream_fp8, BlockSyncConfig()) is True
    weights = _hf_weights(moe=True)
    upstream_fp8.load_weights(weights, runner)
    loaded = dict(runner.model.loaded)
    assert loaded[f"{L0}mlp.gate.weight"].dtype == torch.bfloat16  # the router
    for e in range(E):
        p = f"{L0}mlp.experts.{e}."
        assert loaded[p + "gate_proj.weight"].shape == (FF, H // 2)
        assert float(loaded[p + "gate_proj.weight_scale_2"]) == float(loaded[p + "up_proj.weight_scale_2"])
    slab = torch.zeros(E, 2 * FF, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"mlp.experts.gate_up_proj: a grouped expert slab of NVFP4 experts"):
        upstream_fp8.load_weights([(f"{L0}mlp.experts.gate_up_proj", slab)], runner)


def test_mxfp8_refit_equals_upstreams_mxfp8_refit_bit_for_bit(upstream_fp8):
    if NEMO_RL == "v0.7.0":  # no MXFP8 rollouts on v0.7.0: the hook refuses the format
        assert refit.install(upstream_fp8, BlockSyncConfig(format="mxfp8")) is True
        upstream_fp8.global_fp8_config = upstream_fp8.FP8Config()
        with pytest.raises(RuntimeError, match=r"format=mxfp8 but NeMo-RL's FP8 config is not MXFP8"):
            upstream_fp8.load_weights(_hf_weights(), _runner(_Engine("mxfp8"), Fp8Config()))
        return
    upstream_fp8.global_fp8_config = upstream_fp8.FP8Config(is_mx=True)
    weights = _hf_weights()
    weights[1][1][3, 32:64] = 0  # an all-zero block: byte 0 -> 1
    theirs = _runner(_Engine("mxfp8"), ModelOptMxFp8Config())
    upstream_fp8.load_weights([(n, t.clone()) for n, t in weights], theirs)  # vLLM kernel: the oracle
    n_kernel_calls = len(MXFP8_QUANTIZED)
    assert n_kernel_calls == 7  # every linear weight went through upstream's quantize_mxfp8_weight
    assert refit.install(upstream_fp8, BlockSyncConfig(format="mxfp8")) is True
    ours = _runner(_Engine("mxfp8"), ModelOptMxFp8Config())
    upstream_fp8.load_weights(weights, ours)
    assert len(MXFP8_QUANTIZED) == n_kernel_calls  # patched: nemo_ais.fp8 quantized, not vLLM
    _assert_same_pairs(ours.model.loaded, theirs.model.loaded)  # names, shapes, dtypes, bytes
    scale = dict(ours.model.loaded)[f"{QKV[0]}.weight_scale_from_checkpoint"]
    assert scale.dtype == torch.uint8 and scale.shape == (Q, H // 32) and int(scale[3, 1]) == 1
    # the same pairs as the stream itself (with main's refit scale name)
    cfg = BlockSyncConfig(format="mxfp8", mxfp8_scale_name="weight_scale_from_checkpoint")
    _assert_same_pairs(ours.model.loaded, list(block_weight_stream(weights, cfg)))
    upstream_fp8.global_fp8_config = upstream_fp8.FP8Config()  # a block-FP8 engine
    with pytest.raises(RuntimeError, match=r"format=mxfp8 but NeMo-RL's FP8 config is not MXFP8"):
        upstream_fp8.load_weights(weights, ours)


def test_block_config_reaches_the_vllm_worker_through_env_and_trampoline(monkeypatch):
    env = {refit.ENV_VAR: BlockSyncConfig(format="mxfp8", tp_size=2).model_dump_json()}
    assert refit.config_from_env(env) == BlockSyncConfig(format="mxfp8", tp_size=2)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    refit.install_on_import(BlockSyncConfig())  # the hook's finder, before the import
    module = next(import_upstream_fp8(monkeypatch))  # what the vLLM worker's import does
    assert getattr(module.load_weights, "__nemo_ais_refit__", False)
    assert getattr(module.is_fp8_model, "__nemo_ais_refit__", False)
    sys.modules.pop(refit.TARGET_MODULE, None)
    # the stdlib trampoline arms on NEMO_AIS_REFIT (a fresh interpreter)
    hook = str(REPO / "nemo_ais" / "nemo_rl" / "_vllm_hook")
    child = {**os.environ, "PYTHONPATH": hook, refit.ENV_VAR: env[refit.ENV_VAR]}
    code = "import sys; print(any(getattr(f, 'nemo_ais_fp8_refit', False) for f in sys.meta_path))"
    out = subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_w4a4_hook_reads_the_calibrated_input_amax_file(upstream_fp8, tmp_path):
    with pytest.raises(ValueError, match="nvfp4_w4a4 needs input_amax_file"):
        refit.install(upstream_fp8, BlockSyncConfig(format="nvfp4_w4a4"))
    amax = {
        f"{L0}self_attn.qkv_proj": 4.0,
        f"{L0}self_attn.o_proj": 2.0,
        f"{L0}mlp.gate_up_proj": 8.0,
        f"{L0}mlp.down_proj": 16.0,
    }
    path = tmp_path / "input_amax.json"
    path.write_text(json.dumps(amax))
    cfg = BlockSyncConfig(format="nvfp4_w4a4", input_amax_file=str(path))
    assert refit.install(upstream_fp8, cfg) is True
    runner = _runner(_Engine("nvfp4"), ModelOptNvFp4Config())
    upstream_fp8.load_weights(_hf_weights(), runner)
    loaded = dict(runner.model.loaded)
    for m in QKV:
        assert float(loaded[f"{m}.input_scale"]) == float(torch.tensor(4.0) / torch.tensor(2688.0))


def test_a_relative_input_amax_file_reaches_a_worker_in_another_directory(upstream_fp8, tmp_path, monkeypatch):
    """The driver checks the file from its working directory (NEMO_RL_DIR); a vLLM worker reads it again from its
    own, which Ray does not promise to be the driver's (a cluster started elsewhere): the launcher sends it absolute.
    """
    job, worker = tmp_path / "job", tmp_path / "worker"
    (job / "calibration").mkdir(parents=True)
    worker.mkdir()
    (job / "calibration" / "amax.json").write_text(json.dumps({f"{L0}self_attn.qkv_proj": 4.0}))
    run = _nvfp4_run_config(enabled=True, format="nvfp4_w4a4", input_amax_file="calibration/amax.json")
    env = {}
    monkeypatch.chdir(job)
    assert refit.configure(run, env, section="ais_nvfp4_refit").input_amax_file == str(job / "calibration/amax.json")
    monkeypatch.chdir(worker)
    cfg = refit.config_from_env(env)
    assert cfg.input_amax_file == str(job / "calibration" / "amax.json")
    with pytest.raises(ValueError, match="cannot read it"):  # what a worker here did with the path as written
        refit.install(upstream_fp8, cfg.model_copy(update={"input_amax_file": "calibration/amax.json"}))
    assert refit.install(upstream_fp8, cfg) is True
    # the file the driver read: through a link, ".." is the link target's parent (the kernel's), not job/
    (tmp_path / "shared" / "runs").mkdir(parents=True)
    (job / "runs").symlink_to(tmp_path / "shared" / "runs")
    (tmp_path / "shared" / "amax.json").write_text("{}")
    monkeypatch.chdir(job)
    run["ais_nvfp4_refit"]["input_amax_file"] = "runs/../amax.json"
    sent = refit.configure(run, env, section="ais_nvfp4_refit").input_amax_file
    assert Path(sent).read_text() == "{}" and Path(sent).is_absolute()


# --- NeMo-RL's ModelOpt ignore patterns
def test_ignore_patterns_match_nemo_rls_real_quant_ignore():
    utils = importlib.import_module("nemo_rl.modelopt.utils")
    names = [
        "lm_head.weight",
        f"{L0}self_attn.q_proj.weight",
        f"{L0}self_attn.o_proj.weight",
        f"{L0}mlp.gate_proj.weight",
        f"{L0}mlp.down_proj.weight",
        f"{L0}mlp.gate.weight",
        f"{L0}mlp.experts.3.up_proj.weight",
        "model.layers.7.block_sparse_moe.gate.weight",
        "layers.2.self_attention.linear_qkv.weight",
        "model.layers.2.mlp.router.weight",
    ]
    patterns = list(utils.DEFAULT_NVFP4_IGNORE)
    if NEMO_RL == "v0.7.0":  # the vLLM quantization_config NeMo-RL builds carries them
        patterns = utils.build_vllm_modelopt_nvfp4_config()["ignore"]
    ours = KeepInBf16(ignore=tuple(patterns))
    for name in names:
        theirs = utils.matches_quant_ignore_pattern(name, patterns)
        assert (ours.ignored(name) is not None) == theirs, name
    assert ours.reason(f"{L0}mlp.gate_proj.weight") is None


# --- vLLM's fused weight loaders (stand-ins) and NeMo-RL's post-load processing
def _fused_linear(pairs: dict[str, torch.Tensor], modules: list[str]) -> nn.Module:
    """vLLM's fused-linear loader, stand-in: shards' weight / weight_scale concatenated
    along out, each shard's scalar scales into a ``[n_shards]`` parameter."""
    layer = nn.Module()
    for suffix in ("weight", "weight_scale"):
        data = torch.cat([pairs[f"{m}.{suffix}"] for m in modules])
        setattr(layer, suffix, Parameter(data, requires_grad=False))
    for suffix in ("weight_scale_2", "input_scale"):
        if f"{modules[0]}.{suffix}" in pairs:
            data = torch.stack([pairs[f"{m}.{suffix}"] for m in modules])
            setattr(layer, suffix, Parameter(data, requires_grad=False))
    return layer


def _dequantized_rows(snapshot: dict[str, torch.Tensor], global_scale: torch.Tensor) -> torch.Tensor:
    q = NVFP4Tensor(snapshot["weight"], snapshot["weight_scale"], global_scale.reshape(()))
    return dequantize_nvfp4(q)


def _own_dequant(pairs, modules):
    return torch.cat(
        [
            dequantize_nvfp4(
                NVFP4Tensor(pairs[f"{m}.weight"], pairs[f"{m}.weight_scale"], pairs[f"{m}.weight_scale_2"])
            )
            for m in modules
        ]
    )


def _per_shard_amax_pairs(weights, modules):
    """What a stream WITHOUT the shared global scale would send: each shard its own amax."""
    pairs = {}
    for m in modules:
        q = quantize_nvfp4(dict(weights)[f"{m}.weight"])
        pairs |= {f"{m}.weight": q.data, f"{m}.weight_scale": q.block_scale, f"{m}.weight_scale_2": q.global_scale}
    return pairs


def test_v0_7_0_modelopt_reload_of_the_streamed_nvfp4_loses_nothing(monkeypatch):
    name = "nemo_rl.modelopt.models.generation.vllm_modelopt_patch"
    if NEMO_RL == "main":  # main replaced it with vllm_modelopt.py (next tests)
        assert importlib.util.find_spec(name) is None
        return
    install_vllm_placeholders(monkeypatch)
    marlin = []

    def prepare(layer):  # Marlin's repacking, stand-in: records what it receives
        marlin.append({k: v.detach().clone() for k, v in layer.named_parameters()})

    _stub(
        monkeypatch,
        {"vllm.model_executor.layers.quantization.utils.marlin_utils_fp4": {"prepare_fp4_layer_for_marlin": prepare}},
    )
    patch = importlib.import_module(name)
    weights = _hf_weights()
    pairs = dict(
        block_weight_stream(
            weights,
            BlockSyncConfig(format="nvfp4_w4a4"),
            input_amax={
                f"{L0}self_attn.qkv_proj": 4.0,
                f"{L0}self_attn.o_proj": 1.0,
                f"{L0}mlp.gate_up_proj": 1.0,
                f"{L0}mlp.down_proj": 1.0,
            },
        )
    )
    for modules in (QKV, GATE_UP):
        layer = _fused_linear(pairs, modules)
        scale_bytes = layer.weight_scale.detach().view(torch.uint8).clone()
        patch._modelopt_dense_process_w4a16_weights(types.SimpleNamespace(), layer)  # W4A16
        seen = marlin.pop()
        assert set(seen) == {"weight", "weight_scale", "weight_global_scale"}  # no input scale
        assert torch.equal(seen["weight_scale"].view(torch.uint8), scale_bytes)  # no sign bits
        assert seen["weight_global_scale"].dtype == torch.float32
        assert all(float(seen["weight_global_scale"]) == float(pairs[f"{m}.weight_scale_2"]) for m in modules)
        assert torch.equal(_dequantized_rows(seen, seen["weight_global_scale"]), _own_dequant(pairs, modules))
    # W4A4 through v0.7.0's dense reload: its kernel sees alpha = 1 * weight global scale,
    # i.e. v0.7.0 sets input_global_scale = 1 and does not use the streamed input_scale
    kernel = _RecordingKernel()
    layer = _fused_linear(pairs, QKV)
    patch._modelopt_dense_process_weights(types.SimpleNamespace(quant_config=None, kernel=kernel), layer)
    seen = kernel.seen.pop()
    assert float(seen["input_global_scale"]) == 1.0 and float(seen["alpha"]) == float(seen["weight_global_scale"])
    assert torch.equal(seen["input_scale"], torch.full((3,), 4.0 / 2688.0))  # loaded, unused
    # control: per-shard global scales (no shared amax) are NOT reproduced after the max
    naive = _per_shard_amax_pairs(weights, QKV)
    layer = _fused_linear(naive, QKV)
    patch._modelopt_dense_process_w4a16_weights(types.SimpleNamespace(), layer)
    seen = marlin.pop()
    assert not torch.equal(_dequantized_rows(seen, seen["weight_global_scale"]), _own_dequant(naive, QKV))


@pytest.fixture
def vllm_modelopt(monkeypatch):
    """Main's ``vllm_modelopt.py`` with its vLLM imports stubbed; the registered classes."""
    name = "nemo_rl.modelopt.models.generation.vllm_modelopt"
    if NEMO_RL == "v0.7.0":
        assert importlib.util.find_spec(name) is None  # v0.7.0: vllm_modelopt_patch.py
        yield None, None  # the test checks only that absence
        return
    install_vllm_placeholders(monkeypatch)
    registered = {}

    def register_quantization_config(key):
        return lambda cls: registered.setdefault(key, cls)

    _RecordingKernel.seen, ModelOptNvFp4FusedMoE.processed = [], []
    _stub(
        monkeypatch,
        {
            "vllm.model_executor.kernels.linear": {
                "MarlinNvFp4LinearKernel": _RecordingKernel,
                "NvFp4LinearLayerConfig": lambda: None,
            },
            "vllm.model_executor.layers.fused_moe.oracle.nvfp4": {"NvFp4MoeBackend": NvFp4MoeBackend},
            "vllm.model_executor.layers.linear": {
                "register_weight_loader_v2_supported_method": lambda cls: registered.setdefault("linear", cls)
            },
            "vllm.model_executor.layers.quantization": {"register_quantization_config": register_quantization_config},
            "vllm.model_executor.layers.quantization.modelopt": {
                "ModelOptNvFp4Config": ModelOptNvFp4Config,
                "ModelOptNvFp4FusedMoE": ModelOptNvFp4FusedMoE,
                "ModelOptNvFp4LinearMethod": ModelOptNvFp4LinearMethod,
            },
        },
    )
    sys.modules.pop(name, None)
    module = importlib.import_module(name)
    module.register_nemo_modelopt_nvfp4()
    yield module, registered
    sys.modules.pop(name, None)


def test_main_w4a16_linear_reload_of_the_streamed_nvfp4_loses_nothing(vllm_modelopt):
    module, registered = vllm_modelopt
    if module is None:  # NeMo-RL v0.7.0 (its reload: the vllm_modelopt_patch test)
        return
    method = registered["linear"](quant_config=None)  # NemoModelOptW4A16LinearMethod
    assert registered[module.NEMO_MODELOPT_W4A16].LinearMethodCls is registered["linear"]
    pairs = dict(block_weight_stream(_hf_weights(), BlockSyncConfig()))
    for modules in (QKV, GATE_UP):
        layer = _fused_linear(pairs, modules)
        scale_bytes = layer.weight_scale.detach().view(torch.uint8).clone()
        method.process_weights_after_loading(layer)
        seen = _RecordingKernel.seen.pop()
        assert set(seen) == {"weight", "weight_scale", "weight_global_scale"}
        assert torch.equal(seen["weight_scale"].view(torch.uint8), scale_bytes)
        assert all(float(seen["weight_global_scale"]) == float(pairs[f"{m}.weight_scale_2"]) for m in modules)
        assert torch.equal(_dequantized_rows(seen, seen["weight_global_scale"]), _own_dequant(pairs, modules))
    # upstream's sign-bit canonicalization recovers our (unsigned) scales from signed ones
    scale = pairs[f"{QKV[0]}.weight_scale"]
    signed = (scale.view(torch.uint8) | 0x80).view(torch.float8_e4m3fn)
    module._canonicalize_nvfp4_scale_(signed)
    assert torch.equal(signed.view(torch.uint8), scale.view(torch.uint8))


def _fused_moe(pairs: dict[str, torch.Tensor], layer: nn.Module) -> nn.Module:
    """vLLM's FusedMoE weight loader, stand-in: per-expert shards into the stacked layout,
    gate (w1) rows then up (w3) rows in ``w13``; per-shard global scales into [E, 2] / [E]."""
    p = f"{L0}mlp.experts."

    def stack(fmt):
        return torch.stack([fmt(e) for e in range(E)])

    def put(attr, data):
        setattr(layer, attr, Parameter(data, requires_grad=False))

    for suffix in ("weight", "weight_scale"):
        put(
            f"w13_{suffix}",
            stack(lambda e, s=suffix: torch.cat([pairs[f"{p}{e}.gate_proj.{s}"], pairs[f"{p}{e}.up_proj.{s}"]])),
        )
        put(f"w2_{suffix}", stack(lambda e, s=suffix: pairs[f"{p}{e}.down_proj.{s}"]))
    put(
        "w13_weight_scale_2",
        stack(lambda e: torch.stack([pairs[f"{p}{e}.{m}.weight_scale_2"] for m in ("gate_proj", "up_proj")])),
    )
    put("w2_weight_scale_2", stack(lambda e: pairs[f"{p}{e}.down_proj.weight_scale_2"]))
    return layer


def test_main_moe_reload_and_input_scales_of_the_streamed_nvfp4_experts(vllm_modelopt):
    module, registered = vllm_modelopt
    if module is None:  # NeMo-RL v0.7.0 (its reload: the vllm_modelopt_patch test)
        return
    p = f"{L0}mlp.experts."
    amax = {f"{p}{e}.{m}": 1.0 + e for e in range(E) for m in ("gate_up_proj", "down_proj")}
    amax |= {f"{L0}self_attn.qkv_proj": 1.0, f"{L0}self_attn.o_proj": 1.0}
    pairs = dict(block_weight_stream(_hf_weights(moe=True), BlockSyncConfig(format="nvfp4_w4a4"), input_amax=amax))
    # W4A4: NeMo-RL's MoE method binds its input-scale loader; our per-expert input_scale
    # pairs go through it with vLLM's shard ids (w1 = gate, w3 = up, w2 = down)
    layer = nn.Module()
    layer._map_global_expert_id_to_local_expert_id = lambda e: e
    layer.quant_method = types.SimpleNamespace(use_global_sf=False)
    w4a4 = registered[module.NEMO_MODELOPT_W4A4].FusedMoEMethodCls()
    w4a4.create_weights(layer, E, H, FF, torch.bfloat16)
    for e in range(E):
        for proj, shard, param in (("gate_proj", "w1", "w13"), ("up_proj", "w3", "w13"), ("down_proj", "w2", "w2")):
            target = getattr(layer, f"{param}_input_scale")
            target.weight_loader(target, pairs[f"{p}{e}.{proj}.input_scale"], f"{p}{e}.{proj}.input_scale", shard, e)
    want = torch.tensor([(1.0 + e) / 2688.0 for e in range(E)], dtype=torch.float32)
    assert layer.w13_input_scale.shape == (E, 2) and torch.equal(layer.w13_input_scale[:, 0], want)
    assert torch.equal(layer.w13_input_scale[:, 1], want) and torch.equal(layer.w2_input_scale.data, want)
    # W4A16 MoE reload (Marlin): canonicalized scales, then vLLM's own processing
    w4a16 = registered[module.NEMO_MODELOPT_W4A16].FusedMoEMethodCls()
    layer = _fused_moe(pairs, nn.Module())
    assert layer.w13_weight.shape == (E, 2 * FF, H // 2) and layer.w13_weight.dtype == torch.uint8
    assert layer.w13_weight_scale.shape == (E, 2 * FF, H // 16) and layer.w13_weight_scale.dtype == torch.float8_e4m3fn
    assert layer.w13_weight_scale_2.shape == (E, 2) and layer.w2_weight_scale_2.shape == (E,)
    assert torch.equal(layer.w13_weight_scale_2[:, 0], layer.w13_weight_scale_2[:, 1])  # column 0 == max
    w4a16.process_weights_after_loading(layer)
    seen = ModelOptNvFp4FusedMoE.processed.pop()
    assert layer.w13_input_scale is None and layer.w2_input_scale is None
    for e in range(E):
        rows = {"weight": seen["w13_weight"][e], "weight_scale": seen["w13_weight_scale"][e]}
        got = _dequantized_rows(rows, seen["w13_weight_scale_2"][e].max())  # either revision
        assert torch.equal(got, _own_dequant(pairs, [f"{p}{e}.gate_proj", f"{p}{e}.up_proj"])), e


# --- the launcher's step: the ais_nvfp4_refit section
def _nvfp4_run_config(**section):
    generation = {
        "real_quant": True,
        "real_quant_ignore": ["lm_head", "*self_attn*"],
        "vllm_cfg": {"precision": "bfloat16", "tensor_parallel_size": 2},
    }
    return {"policy": {"generation": generation}, "ais_fp8_refit": {"enabled": False}, "ais_nvfp4_refit": section}


def test_configure_arms_the_hook_from_the_section_with_the_engines_defaults():
    env = {"PYTHONPATH": "/x"}
    assert refit.configure({"policy": {}}, env, section="ais_nvfp4_refit") is None and env == {"PYTHONPATH": "/x"}
    assert refit.configure(_nvfp4_run_config(enabled=False), env, section="ais_nvfp4_refit") is None
    cfg = refit.configure(_nvfp4_run_config(enabled=True), env, section="ais_nvfp4_refit")
    assert cfg == BlockSyncConfig(tp_size=2, ignore=("lm_head", "*self_attn*"))  # the engine's
    assert refit.config_from_env(env) == cfg
    assert env["PYTHONPATH"].split(os.pathsep) == [str(refit.HOOK_DIR), "/x"]
    assert (refit.HOOK_DIR / "sitecustomize.py").is_file()
    run = _nvfp4_run_config(enabled=True)
    del run["policy"]["generation"]["real_quant_ignore"]  # NeMo-RL's default list then
    utils = importlib.import_module("nemo_rl.modelopt.utils")
    assert refit.configure(run, {}, section="ais_nvfp4_refit").ignore == tuple(utils.DEFAULT_NVFP4_IGNORE)


def test_configure_with_vllm_expert_parallelism_checks_experts_whole():
    """vllm_cfg.expert_parallel_size > 1 (NeMo-RL turns on vLLM's enable_expert_parallel): each expert is whole on
    one rank, so its gate/up/down are not split by tp_size: an expert down_proj of in-dim 192 (24 per rank at TP 8,
    not a multiple of NVFP4's 16) was refused."""
    run = _nvfp4_run_config(enabled=True, format="nvfp4_w4a16")
    run["policy"]["generation"]["vllm_cfg"].update(tensor_parallel_size=8)
    name = "model.layers.0.mlp.experts.3.down_proj.weight"
    with pytest.raises(ValueError, match=r"with tp_size=8: row-parallel in dim 1 of size 192 gives a per-rank shard"):
        plan_tensor(name, (2048, 192), torch.bfloat16, refit.configure(run, {}, section="ais_nvfp4_refit"))
    run["policy"]["generation"]["vllm_cfg"].update(expert_parallel_size=8)
    cfg = refit.configure(run, {}, section="ais_nvfp4_refit")
    assert cfg.expert_tp_size == 1 and cfg.tp_size == 8
    assert plan_tensor(name, (2048, 192), torch.bfloat16, cfg).action == "quantize"
    dense = "model.layers.0.mlp.down_proj.weight"  # a dense layer is still split by tp_size
    with pytest.raises(ValueError, match=r"with tp_size=8: row-parallel"):
        plan_tensor(dense, (2048, 192), torch.bfloat16, cfg)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"format": "mxfp8"}, r"ais_nvfp4_refit.format='mxfp8' is invalid"),
        ({"format": "nvfp4_w4a4"}, r"ais_nvfp4_refit.input_amax_file=None is invalid with format nvfp4_w4a4"),
        ({"famly": 1}, r"ais_nvfp4_refit\.famly"),
        ({"real_quant": None}, r"needs policy.generation.real_quant: true \(got None\)"),
        ({"fp8": True}, r"ais_fp8_refit and ais_nvfp4_refit are both enabled"),
    ],
)
def test_configure_refuses_naming_the_field(change, match):
    run = _nvfp4_run_config(enabled=True)
    if "real_quant" in change:
        run["policy"]["generation"]["real_quant"] = change.pop("real_quant")
    if change.pop("fp8", False):
        run["ais_fp8_refit"] = {}
    run["ais_nvfp4_refit"].update(change)
    with pytest.raises(ValueError, match=match):
        refit.configure(run, {}, section="ais_nvfp4_refit")


def test_one_patch_has_an_engine_row_for_every_format_and_one_environment_variable():
    from nemo_ais.rules.native_kernels import NATIVE_KERNELS

    assert {k.family for k in NATIVE_KERNELS.values()} == set(refit.ENGINES)
    for section, model in refit.SECTIONS.items():  # each section's config comes back as itself
        cfg = model(tp_size=2)
        assert type(refit.config_from_env({refit.ENV_VAR: cfg.model_dump_json()})) is model
        assert section in refit.SECTIONS
    assert refit.config_from_env({refit.ENV_VAR: '{"tp_size": 2}'}) == Fp8SyncConfig(tp_size=2)
    with pytest.raises(ValueError, match=r"famly\n  Extra inputs are not permitted"):
        refit.config_from_env({refit.ENV_VAR: '{"famly": "a"}'})  # the field named
    with pytest.raises(ValueError, match=r"section='ais_fp4_refit' is invalid"):
        refit.configure({}, {}, section="ais_fp4_refit")


def test_a_failed_refit_chunk_leaves_nothing_held_for_the_next_refit(upstream_fp8):
    runner = _runner(_Engine("nvfp4"), ModelOptNvFp4Config())
    assert refit.install(upstream_fp8, BlockSyncConfig()) is True
    weights = _hf_weights()
    o_proj = next(i for i, (n, _) in enumerate(weights) if n.endswith("o_proj.weight"))
    bad = [weights[0], weights[1], (weights[o_proj][0], torch.full_like(weights[o_proj][1], float("nan")))]
    with pytest.raises(ValueError, match="NaN"):  # q_proj is held for its fused group by then
        upstream_fp8.load_weights(bad, runner)
    for _, t in bad:
        t.fill_(7.0)  # the transport reuses the failed chunk's buffers
    # the next refit sends q_proj after k_proj and v_proj: a stale q_proj still held would
    # complete the group with the failed chunk's overwritten buffer
    second = [weights[0], weights[2], weights[3], weights[1], *weights[4:]]
    want = list(block_weight_stream([(n, t.clone()) for n, t in second], BlockSyncConfig()))
    upstream_fp8.load_weights(second, runner)
    _assert_same_pairs(runner.model.loaded, want)
