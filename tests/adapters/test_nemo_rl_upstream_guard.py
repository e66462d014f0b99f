# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Fails loudly when NeMo-RL changes an interface the adapter relies on (source-level check).

Reads the installed NeMo-RL's SOURCE with ``ast`` (no import: most of these modules need
CUDA, vLLM or Megatron-Bridge) and compares each relied-on function with what was
recorded for the session's version (v0.7.0 or main; ``per_version`` where they differ): the FP8 refit functions that ``nemo_ais.nemo_rl.refit`` patches or
calls (same table the runtime check uses), the worker methods the AIS workers override,
and the facts the seam is built on (DP group of the valid-token counts, metric scaling
rule, ``policy_factory`` / ``worker_extension_cls_fqn`` seams, the loss returned by setup).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from nemo_rl_version import per_version

from nemo_ais.nemo_rl.refit import RECORDED_SIGNATURES

pytestmark = pytest.mark.nemo_rl

_SPEC = importlib.util.find_spec("nemo_rl")
assert _SPEC is not None and _SPEC.submodule_search_locations, "tests/conftest.py puts NeMo-RL on the path"
ROOT = Path(next(iter(_SPEC.submodule_search_locations)))


def _module(dotted: str) -> ast.Module:
    rel = dotted.removeprefix("nemo_rl.").replace(".", "/") + ".py"
    return ast.parse((ROOT / rel).read_text())


def _find(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.ClassDef:
    node: ast.AST = tree
    for part in qualname.split("."):
        matches = [
            n for n in ast.iter_child_nodes(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part
        ]
        assert matches, f"{qualname}: {part} not found in NeMo-RL's source"
        node = matches[0]
    return node


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        names.append("*")
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def _split(full: str) -> tuple[str, str]:
    """'nemo_rl.a.b.Class.method' -> ('nemo_rl.a.b', 'Class.method') by file existence."""
    parts = full.split(".")
    for i in range(len(parts) - 1, 1, -1):
        rel = "/".join(parts[1:i]) + ".py"
        if (ROOT / rel).exists():
            return ".".join(parts[:i]), ".".join(parts[i:])
    raise AssertionError(f"{full}: no module file found under {ROOT}")


@pytest.mark.parametrize("full", sorted(RECORDED_SIGNATURES))
def test_fp8_refit_functions_keep_their_recorded_signatures(full):
    module, qualname = _split(full)
    fn = _find(_module(module), qualname)
    names = re.sub(r": [^,)]+", "", RECORDED_SIGNATURES[full])  # the AST gives names only
    assert "(" + ", ".join(_params(fn)) + ")" == names, full


def test_refit_calls_the_module_attribute_at_call_time():
    # v0.7.0: _load_weights calls it; main: _load_weights -> _load_hf_weights calls it
    method = per_version(v0_7_0="_load_weights", main="_load_hf_weights")
    tree = _module("nemo_rl.models.generation.vllm.vllm_backend")
    src = ast.unparse(_find(tree, f"VllmInternalWorkerExtension.{method}"))
    assert "from nemo_rl.models.generation.vllm.quantization import fp8" in src
    assert "fp8.load_weights(policy_weights, self.model_runner)" in src
    if method != "_load_weights":
        caller = ast.unparse(_find(tree, "VllmInternalWorkerExtension._load_weights"))
        assert f"self.{method}(policy_weights)" in caller


WORKERS = {
    "nemo_rl.models.policy.workers.megatron_policy_worker": "MegatronPolicyWorkerImpl",
    "nemo_rl.models.policy.workers.dtensor_policy_worker": "DTensorPolicyWorkerImpl",
    "nemo_rl.models.policy.workers.dtensor_policy_worker_v2": "DTensorPolicyWorkerV2Impl",
}


@pytest.mark.parametrize("module", sorted(WORKERS))
def test_worker_methods_the_ais_mixin_overrides(module):
    tree = _module(module)
    cls = WORKERS[module]
    train = _params(_find(tree, f"{cls}.train"))
    assert train[:6] == ["self", "data", "loss_fn", "eval_mode", "gbs", "mbs"], train
    assert _params(_find(tree, f"{cls}.save_checkpoint"))[:2] == ["self", "weights_path"]
    assert "weights_path" in _params(_find(tree, f"{cls}.__init__"))
    src = ast.unparse(_find(tree, f"{cls}.train"))
    # every metric except *_min / *_max is divided by the number of global batches (the
    # v2 worker does it in nemo_rl/models/automodel/train.py)
    scaling = src if "v2" not in module else (ROOT / "models/automodel/train.py").read_text()
    assert "'_min' in k or '_max' in k" in scaling or '"_min" in k or "_max" in k' in scaling
    # the valid-token counts are summed over the group the AIS workers use
    group = "parallel_state.get_data_parallel_group()" if "megatron" in module else "self.dp_mesh.get_group()"
    assert group in src


def test_megatron_dp_group_excludes_context_parallel_ranks():
    # NeMo-RL calls get_data_parallel_group() without arguments: with_context_parallel=False,
    # which nemo_ais.megatron.get_data_parallel_group passes explicitly.
    import inspect

    from megatron.core import parallel_state

    sig = inspect.signature(parallel_state.get_data_parallel_group)
    assert sig.parameters["with_context_parallel"].default is False


def test_policy_and_setup_seams():
    policy = _module("nemo_rl.models.policy.lm_policy")
    assert "worker_extension_cls_fqn" in _params(_find(policy, "Policy.__init__"))
    train_src = ast.unparse(_find(policy, "Policy.train"))
    assert "'loss_fn': loss_fn" in train_src  # the loss object is shipped on every call
    grpo = _module("nemo_rl.algorithms.grpo")
    setup = _find(grpo, "setup")
    assert "policy_factory" in _params(setup)
    # main passes the Megatron flag on (the launcher's swap_loss keeps it: compat)
    assert per_version(
        v0_7_0="loss_fn = ClippedPGLossFn(loss_config)",
        main="loss_fn = ClippedPGLossFn(loss_config, use_fused_linear_logprobs=use_fused_linear_logprobs)",
    ) in ast.unparse(setup)
    loss = _module("nemo_rl.algorithms.loss.loss_functions")
    assert _params(_find(loss, "ClippedPGLossFn.__call__")) == [
        "self",
        "next_token_logprobs",
        "data",
        "global_valid_seqs",
        "global_valid_toks",
    ]


def test_registry_and_guards_the_launcher_handles():
    registry = (ROOT / "distributed" / "ray_actor_environment_registry.py").read_text()
    for base in WORKERS:
        name = base + "." + WORKERS[base].removesuffix("Impl")
        assert f'"{name}"' in registry, name
    grpo = (ROOT / "algorithms" / "grpo.py").read_text()
    # FP8 rollout and async GRPO assert NeMo-RL's IS flag (see nemo_rl_view)
    assert (
        grpo.count("loss_fn.use_importance_sampling_correction")
        + grpo.count("loss_config.use_importance_sampling_correction")
        >= 2
    )
    # grpo_train reads these NeMo-RL loss metrics unconditionally (kept in AIS mode)
    assert 'metrics["token_mult_prob_error"]' in grpo and "metrics['gen_kl_error']" in grpo
