# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""``AISMegatronPolicyWorker.calibrate_qkv_fp8_scales`` keeps NeMo-RL v0.7.0's contract.

The worker class is the real one (the class under ``@ray.remote``), imported with NeMo-RL's
real Megatron worker module as its base (``tests/_megatron_worker.py``: placeholders only
for Megatron-Bridge, which does not install on CPU, and for four names megatron-core
0.16.1 lacks). The override runs on a stand-in ``self`` (upstream's ``__init__`` needs
GPUs) whose model has Megatron-Core's module names
(``decoder.layers.N.self_attention.core_attention`` with ``layer_number``) and whose
``get_logprobs`` calls each ``core_attention(query, key, value, mask)``. The scales are
checked against a numpy oracle of each rule (the default: upstream's nearest-rank percentile
of the per-micro-batch ``max |x|``; ``element_percentile``: ``numpy.percentile`` per
micro-batch, then the max; equality with upstream's own function is in
``tests/upstream/test_refit_kv_scales.py``); the result has exactly the
structure upstream returns -- ``layers`` keyed like ``convert_calibration_to_vllm_format``
of ``layer_N`` entries, in the same order -- and a version guard compares the upstream
method's signature with the one recorded for v0.7.0 and with our override's. A real
``GPTModel`` is calibrated in ``tests/distributed/test_megatron_kv_calibration.py``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import logging
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from _megatron_worker import Placeholder, megatron_worker_modules
from torch import nn

from nemo_ais.megatron.kv_calibration import KV_REDUCTION_ENV
from nemo_ais.refit.kv_scales import kv_scale_names

pytestmark = pytest.mark.nemo_rl  # the worker class is built on NeMo-RL's real Megatron worker

LAYERS, PERCENTILE, MARGIN = 3, 99.0, 1.05
E4M3_MAX, FLOOR = 448.0, 1e-4
UPSTREAM_CLASS = "MegatronPolicyWorkerImpl"
# ast.unparse of the v0.7.0 arguments and return annotation
RECORDED_SIGNATURE = (
    "self, *, data: BatchedDataDict[Any], micro_batch_size: Optional[int]=None, "
    "percentile: float=99.9, margin: float=1.05, include_q: bool=False -> dict[str, Any]"
)
OUR_WORKER = Path(__file__).parents[2] / "nemo_ais" / "nemo_rl" / "workers" / "megatron.py"


# ---- stand-in worker -----------------------------------------------------------------------


class _CoreAttention(nn.Module):
    def forward(self, query, key, value, attention_mask, **kwargs):
        return query


class _SelfAttention(nn.Module):
    def __init__(self, layer_number: int) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.core_attention = _CoreAttention()


class _Layer(nn.Module):
    def __init__(self, layer_number: int) -> None:
        super().__init__()
        self.self_attention = _SelfAttention(layer_number)


class _Wrapped(nn.Module):
    """``module.decoder.layers.N`` as under NeMo-RL's DDP wrapper."""

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.module = nn.Module()
        self.module.decoder = nn.Module()
        self.module.decoder.layers = nn.ModuleList(_Layer(i + 1) for i in range(num_layers))


def _qkv(seed: int, layer: int):
    g = torch.Generator().manual_seed(seed * 100 + layer)
    scale = 1.0 + layer  # per-layer magnitude, so keys cannot be swapped silently
    q = torch.randn(6, 2, 4, 8, generator=g) * scale  # [s, b, heads, dim]
    k = torch.randn(6, 2, 2, 8, generator=g) * scale * 2  # GQA: 2 groups
    v = torch.randn(6, 2, 2, 8, generator=g) * scale * 3
    return q, k, v


class _StandInWorker:
    """What the override touches on ``self``: model, megatron_bridge, get_logprobs, and the
    last calibration's scales (a class attribute of the real worker, None before the first)."""

    _ais_kv_scales = None

    def __init__(self) -> None:
        self.model = _Wrapped(LAYERS)
        self.megatron_bridge = types.SimpleNamespace(transformer_config=types.SimpleNamespace(num_layers=LAYERS))
        self.calls = []

    def _ais_device(self):
        return None

    def get_logprobs(self, *, data, micro_batch_size=None, require_router_replay=True):
        self.calls.append((data, micro_batch_size, require_router_replay))
        for seed in data["seeds"]:  # one micro-batch per seed
            for layer, block in enumerate(self.model.module.decoder.layers):
                q, k, v = _qkv(seed, layer)
                block.self_attention.core_attention(q, k, v, None, attn_mask_type=None)
        return {"logprobs": None}


@pytest.fixture(scope="module")
def worker_cls():
    """The real ``AISMegatronPolicyWorker`` class (under Ray's actor wrapper)."""
    with megatron_worker_modules() as modules:
        cls = modules.ours.AISMegatronPolicyWorker.__ray_actor_class__
        assert issubclass(cls, modules.upstream.MegatronPolicyWorkerImpl)
        yield cls
    assert Placeholder.used == []


def _calibrate(worker_cls, **kwargs):
    worker = _StandInWorker()
    kwargs.setdefault("data", {"seeds": [1, 2]})
    out = worker_cls.calibrate_qkv_fp8_scales(worker, **kwargs)
    return worker, out


def _oracle(seeds, include_q: bool, reduction: str) -> dict[str, float]:
    out = {}
    for layer in range(LAYERS):
        names = kv_scale_names(layer)
        for j, kind in enumerate("qkv"):
            if kind == "q" and not include_q:
                continue
            x = [np.abs(_qkv(s, layer)[j].double().numpy()) for s in seeds]
            if reduction == "element_percentile":
                amax = max(float(np.percentile(a, PERCENTILE)) for a in x)
            else:  # nearest rank of the per-micro-batch maxima (upstream's _percentile)
                maxima = sorted(float(a.max()) for a in x)
                amax = maxima[round(PERCENTILE / 100 * (len(maxima) - 1))]
            out[names[kind]] = max(amax, FLOOR) * MARGIN / E4M3_MAX
    return out


# ---- the override on a stand-in self -------------------------------------------------------


@pytest.mark.parametrize("reduction", [None, "percentile_of_amax", "element_percentile"])
@pytest.mark.parametrize("include_q", [True, False])
def test_override_scales_equal_the_rules_oracle(worker_cls, include_q, reduction, monkeypatch):
    if reduction is None:  # unset: NeMo-RL's rule
        monkeypatch.delenv(KV_REDUCTION_ENV, raising=False)
    else:
        monkeypatch.setenv(KV_REDUCTION_ENV, reduction)
    worker, out = _calibrate(worker_cls, micro_batch_size=3, percentile=PERCENTILE, margin=MARGIN, include_q=include_q)
    assert worker.calls == [({"seeds": [1, 2]}, 3, False)]  # no router replay, mbs passed on
    assert set(out) == {"format", "percentile", "margin", "layers"}
    assert out["format"] == "fp8" and out["percentile"] == PERCENTILE and out["margin"] == MARGIN
    want = _oracle([1, 2], include_q, reduction or "percentile_of_amax")
    assert list(out["layers"]) == list(want)
    for name, value in want.items():
        assert type(out["layers"][name]) is float
        assert math.isclose(out["layers"][name], value, rel_tol=1e-6), name
    # hooks are removed afterwards
    for block in worker.model.module.decoder.layers:
        assert not block.self_attention.core_attention._forward_pre_hooks


def test_second_calibration_logs_what_the_previous_scales_saturate(worker_cls, monkeypatch, caplog):
    # issue 18 item 2: the fraction of K / V elements above scale * 448, where scale is what
    # the rollout's FP8 cache held (the previous calibration's), over this step's data
    monkeypatch.setenv(KV_REDUCTION_ENV, "element_percentile")  # clips the top 1 % (p = 99)
    worker = _StandInWorker()
    calibrate = functools.partial(worker_cls.calibrate_qkv_fp8_scales, worker, percentile=PERCENTILE, margin=1.0)
    with caplog.at_level(logging.INFO, logger="nemo_ais.megatron.kv_calibration"):
        first = calibrate(data={"seeds": [1, 2]})
        assert "saturation under the previous scales" not in caplog.text  # nothing before
        calibrate(data={"seeds": [3, 4]})
    (record,) = [r for r in caplog.records if "under the previous scales" in r.getMessage()]
    fractions = record.args
    for j, kind in ((1, "k"), (2, "v")):
        over = total = 0
        for layer in range(LAYERS):
            scale = first["layers"][kv_scale_names(layer)[kind]]
            for seed in (3, 4):
                x = _qkv(seed, layer)[j].float()
                over += int(((x / torch.tensor(scale, dtype=torch.float32)).abs() > E4M3_MAX).sum())
                total += x.numel()
        assert 0 < over < total  # non-vacuous: the element rule clips about 1 %
        assert math.isclose(fractions[f"kv_cache/saturated_frac_{kind}"], over / total)
    assert "kv_cache/saturated_frac_q" not in fractions  # q was not calibrated
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("exceed the previous scales * 448" in r.getMessage() for r in warned)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"percentile": 0.0}, "percentile=0.0 is invalid"),
        ({"percentile": 100.5}, "percentile=100.5 is invalid"),
        ({"margin": 0.9}, "margin=0.9 is invalid"),
        ({"margin": float("nan")}, "margin=nan is invalid"),
        ({"include_q": "yes"}, "include_q='yes' is invalid"),
    ],
)
def test_override_rejects_bad_arguments_before_the_forward(worker_cls, kwargs, match):
    worker = _StandInWorker()
    with pytest.raises(ValueError, match=match):
        worker_cls.calibrate_qkv_fp8_scales(worker, data={"seeds": [1]}, **kwargs)
    assert worker.calls == []


def test_override_refuses_a_model_without_megatron_attention(worker_cls):
    worker = _StandInWorker()
    worker.model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"decoder\.layers\.N\.self_attention"):
        worker_cls.calibrate_qkv_fp8_scales(worker, data={"seeds": [1]})


def test_override_refuses_nonfinite_activations(worker_cls):
    worker = _StandInWorker()

    def bad_logprobs(**kwargs):
        q, k, v = _qkv(1, 0)
        k[0, 0, 0, 0] = float("nan")
        for block in worker.model.module.decoder.layers:
            block.self_attention.core_attention(q, k, v, None)

    worker.get_logprobs = bad_logprobs
    with pytest.raises(ValueError, match="non-finite activations"):
        worker_cls.calibrate_qkv_fp8_scales(worker, data={})


# ---- against NeMo-RL's source and converter -------------------------------------------------


def _upstream_method() -> ast.FunctionDef:
    spec = importlib.util.find_spec("nemo_rl")
    root = Path(next(iter(spec.submodule_search_locations)))
    tree = ast.parse((root / "models/policy/workers/megatron_policy_worker.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == UPSTREAM_CLASS)
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "calibrate_qkv_fp8_scales")


def _ours() -> ast.FunctionDef:
    tree = ast.parse(OUR_WORKER.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "calibrate_qkv_fp8_scales")


def _shape(fn: ast.FunctionDef) -> list[tuple[str, str, str | None]]:
    """(name, kind, default) of each parameter, annotations ignored."""
    a = fn.args
    pos = [(p.arg, "pos", None) for p in a.posonlyargs + a.args]
    kw = [
        (p.arg, "kw", None if d is None else ast.unparse(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
    ]
    return pos + kw + ([("**", a.kwarg.arg, None)] if a.kwarg else [])


@pytest.fixture
def upstream_fp8_utils():
    """NeMo-RL's converter module."""
    return importlib.import_module("nemo_rl.models.generation.vllm.quantization.fp8_train_utils")


def test_upstream_signature_is_the_recorded_one_and_ours_matches():
    fn = _upstream_method()
    got = ast.unparse(fn.args) + " -> " + ast.unparse(fn.returns)
    assert got == RECORDED_SIGNATURE, f"NeMo-RL changed calibrate_qkv_fp8_scales: {got}"
    assert _shape(_ours()) == _shape(fn)
    src = ast.unparse(fn)  # what the driver relies on: the flat vLLM-name dict
    assert "convert_calibration_to_vllm_format(result_layers)" in src
    assert "'layers': vllm_format_scales" in src


def test_result_structure_is_what_nemo_rl_returns(upstream_fp8_utils, worker_cls):
    convert_calibration_to_vllm_format = upstream_fp8_utils.convert_calibration_to_vllm_format
    get_vllm_qkv_scale_names = upstream_fp8_utils.get_vllm_qkv_scale_names
    _, out = _calibrate(worker_cls, include_q=True)  # the driver always passes include_q=True
    upstream_layers = convert_calibration_to_vllm_format(
        {f"layer_{i}": {"q_scale": 1.0, "k_scale": 2.0, "v_scale": 3.0} for i in range(LAYERS)}
    )
    assert list(out) == ["format", "percentile", "margin", "layers"]
    assert out["format"] == "fp8"
    assert type(out["percentile"]) is float and type(out["margin"]) is float
    assert list(out["layers"]) == list(upstream_layers)  # same names, same order
    assert all(type(v) is float and v > 0 for v in out["layers"].values())
    for i in range(LAYERS):  # the refit looks the scales up by these names
        assert set(get_vllm_qkv_scale_names(i).values()) == set(kv_scale_names(i).values())
