# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The FP8 refit seam without vLLM: pairs, the version-checked patch and the import hook.

A stand-in for NeMo-RL's ``quantization/fp8.py`` module (same function signatures as
v0.7.0) is patched exactly as the real one would be in a vLLM worker; the upstream
signatures themselves are checked against the NeMo-RL source in
``test_nemo_rl_upstream_guard.py``.
"""

from __future__ import annotations

import json
import sys
import textwrap
import types

import pytest
import torch

from nemo_ais.fp8 import Fp8SyncConfig, quantize_blockwise
from nemo_ais.nemo_rl import refit

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
    with pytest.raises(ValueError, match=rf"{NORM}: the vLLM engine holds it in FP8"):
        list(refit.refit_pairs(_weights(), lambda name: True, CONFIG))
    bad = _weights()
    bad[0][1][3, 5] = float("nan")
    with pytest.raises(ValueError, match="q_proj"):
        list(refit.refit_pairs(bad, lambda name: name == Q, CONFIG))


def _fake_nemo_rl_fp8(name="fake_nemo_rl_fp8", signature="weights, model_runner"):
    module = types.ModuleType(name)
    exec(  # the v0.7.0 signatures, a recording body
        textwrap.dedent(
            f"""
            calls = []
            def load_weights({signature}):
                calls.append("nemo_rl")
            def _is_fp8_weight(name, model):
                return name.endswith("q_proj.weight")
            """
        ),
        module.__dict__,
    )
    return module


class _Model:
    def __init__(self):
        self.loaded = []

    def load_weights(self, weights):
        self.loaded = [(n, t.dtype) for n, t in weights]  # consumes the stream


def test_install_patches_once_and_streams_into_vllm():
    module = _fake_nemo_rl_fp8()
    assert refit.install(module, CONFIG) is True
    assert refit.install(module, CONFIG) is False  # idempotent
    runner = types.SimpleNamespace(model=_Model())
    module.load_weights(_weights(), runner)
    assert module.calls == []  # NeMo-RL's quantizer no longer runs
    assert runner.model.loaded == [
        (Q, torch.float8_e4m3fn),
        (Q.removesuffix(".weight") + ".weight_scale_inv", torch.float32),
        (NORM, torch.bfloat16),
    ]


def test_install_refuses_a_changed_upstream_signature():
    module = _fake_nemo_rl_fp8(signature="weights, model_runner, extra=None")
    with pytest.raises(RuntimeError, match=r"load_weights: signature .*recorded \(weights, mo"):
        refit.install(module, CONFIG)
    assert module.load_weights.__name__ == "load_weights" and not hasattr(
        module.load_weights, "__wrapped__"
    )


def test_import_hook_patches_on_first_import(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_pkg_refit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "fp8.py").write_text(
        "def load_weights(weights, model_runner):\n    return 'nemo_rl'\n"
        "def _is_fp8_weight(name, model):\n    return False\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    refit.install_on_import(CONFIG, target="fake_pkg_refit.fp8")
    import fake_pkg_refit.fp8 as fp8

    runner = types.SimpleNamespace(model=_Model())
    assert fp8.load_weights(_weights(), runner) is None  # ours, not 'nemo_rl'
    assert [n for n, _ in runner.model.loaded] == [Q, NORM]


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
