# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The four comparison arms of each model run the same code (issue 11, defect 4).

Each model's arms (``bf16``, ``fp8_none``, ``fp8_tis``, ``fp8_ais`` under
``configs/nemo_rl/experiments/``) are loaded with NeMo-RL's real ``load_config``. Then:

* **Policy factory -> worker**: our factory is called with the keyword arguments of
  ``grpo.setup``'s ``init_policy`` and builds upstream's real ``Policy``. It is stopped at
  the Ray actor-creation boundary: ``RayWorkerGroup`` (and the ``RayQueue`` actor that
  ``Policy.__init__`` creates first) in ``nemo_rl.models.policy.lm_policy`` are replaced by
  recorders; the recorded ``RayWorkerBuilder`` is upstream's real one. Every arm must
  reach it with the same AIS worker class (so the same KV calibration and the same
  prepare step), and the policy config handed to the builder may differ between arms
  only in the rollout precision keys.
* **Worker -> loss**: each arm's loss (built from its ``loss_fn`` section) trains one
  global batch through :class:`AISTrainMixin` over a stand-in for upstream's Megatron
  worker (GPU only) whose ``train`` runs NeMo-RL's micro-batch loop and records every
  loss call. ``mode: none`` arms must give loss and gradients bit-identical
  (``torch.equal``) to upstream's real ``ClippedPGLossFn`` built from the same
  ``loss_fn`` section; every arm reports the same ``ais/*`` telemetry.
"""

from __future__ import annotations

from pathlib import Path

import nemo_rl  # noqa: F401  (required: tests/conftest.py)
import pytest
import torch
import torch.distributed as dist
from _ray_boundary import MEGATRON_AIS_WORKER, ActorBoundary, build_policy
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossConfig, ClippedPGLossFn
from nemo_rl.distributed import ray_actor_environment_registry as registry
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl.utils.config import load_config, register_omegaconf_resolvers
from omegaconf import OmegaConf

from nemo_ais.nemo_rl import AISClippedPGLossFn
from nemo_ais.nemo_rl.policy_factory import make_policy_factory
from nemo_ais.nemo_rl.seam import GLOBAL_BATCH_KEY
from nemo_ais.nemo_rl.workers.mixin import AISTrainMixin

pytestmark = pytest.mark.nemo_rl

EXPERIMENTS = Path(__file__).resolve().parents[2] / "configs" / "nemo_rl" / "experiments"
MODELS = ("qwen3_8b", "smoke")
ARMS = ("bf16", "fp8_none", "fp8_tis", "fp8_ais")
# what the arms may change in the policy config (rollout precision only)
ROLLOUT_KEYS = {"precision", "kv_cache_dtype", "use_deep_gemm"}
GBS, MBS = 8, 4  # one global batch of two micro-batches on one DP rank


def _load(model: str, arm: str) -> dict:
    register_omegaconf_resolvers()
    cfg = load_config(str(EXPERIMENTS / f"{model}_{arm}.yaml"))
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture(scope="module")
def arms():
    return {m: {a: _load(m, a) for a in ARMS} for m in MODELS}


@pytest.fixture
def ray_boundary(monkeypatch, tmp_path):
    """Record what reaches actor creation in ``lm_policy``; stop there (``_ray_boundary``)."""
    return ActorBoundary(stop=True).install(monkeypatch, tmp_path)


def _build_policy(raw: dict) -> None:
    """What ``grpo.setup`` does with ``policy_factory`` (its ``init_policy`` kwargs)."""
    factory = make_policy_factory(raw)
    assert factory is not None, f"loss_fn.ais.mode={raw['loss_fn']['ais']['mode']}: no factory"
    build_policy(factory, raw)


def _diff(a, b, path=()):
    """Paths where two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) | set(b)
        return [p for k in sorted(keys) for p in _diff(a.get(k), b.get(k), (*path, k))]
    return [] if a == b else [path]


@pytest.mark.parametrize("model", MODELS)
def test_every_arm_builds_the_same_ais_worker(arms, ray_boundary, model):
    for arm in ARMS:
        _build_policy(arms[model][arm])
    groups = ray_boundary.groups
    assert len(groups) == len(ARMS) and len(ray_boundary.queues) == len(ARMS)
    fqns = [g["builder"].ray_actor_class_fqn for g in groups]
    assert fqns == [MEGATRON_AIS_WORKER] * len(ARMS), dict(zip(ARMS, fqns, strict=True))
    # one Python environment for the AIS worker, whatever the arm: the base's prebuilt venv
    assert registry.get_actor_python_env(MEGATRON_AIS_WORKER) == ray_boundary.venv_python
    # the worker's config differs between arms only in the rollout precision
    configs = [g["builder"].args[0] for g in groups]
    for arm, cfg in zip(ARMS[1:], configs[1:], strict=True):
        changed = _diff(configs[0], cfg)
        assert {p[-1] for p in changed} <= ROLLOUT_KEYS, (arm, changed)
        assert all(p[:2] == ("generation", "vllm_cfg") for p in changed), (arm, changed)
    assert [g["env_vars"] for g in groups] == [groups[0]["env_vars"]] * len(ARMS)


# ----------------------------------------------------------------- worker -> loss


def _batch(seed: int = 0, b: int = GBS, s: int = 12) -> tuple[BatchedDataDict, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    token_mask = torch.ones(b, s, dtype=torch.int64)
    token_mask[:, 0] = 0
    lengths = torch.randint(3, s + 1, (b,), generator=g)
    token_mask[torch.arange(s)[None, :] >= lengths[:, None]] = 0
    sample_mask = torch.ones(b, dtype=torch.int64)
    sample_mask[1] = 0
    gen = -2.0 * torch.rand(b, s, generator=g) - 0.05
    prev = gen + 0.2 * torch.randn(b, s, generator=g)
    data = BatchedDataDict(
        {
            "input_ids": torch.randint(0, 8, (b, s), generator=g),
            "input_lengths": lengths,
            "token_mask": token_mask,
            "sample_mask": sample_mask,
            "advantages": torch.randn(b, 1, generator=g).expand(b, s).clone(),
            "prev_logprobs": prev,
            "generation_logprobs": gen,
            "reference_policy_logprobs": prev + 0.1 * torch.randn(b, s, generator=g),
        }
    )
    curr = prev[:, 1:] + 0.1 * torch.randn(b, s - 1, generator=g)
    return data, curr


class _MegatronStandIn:
    """Stand-in for upstream's Megatron worker (GPU only): NeMo-RL's micro-batch loop.

    Records, per loss call, the data it got, the loss, the gradient w.r.t. the
    next-token log-probs and the metrics.
    """

    def __init__(self, cfg: dict, curr: torch.Tensor):
        self.cfg = cfg
        self.curr = curr
        self.calls: list[dict] = []

    def train(self, data, loss_fn, eval_mode=False, gbs=None, mbs=None):
        mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
        global_valid_seqs = data["sample_mask"].sum()
        global_valid_toks = mask.sum()
        for start in range(0, data.size, mbs):
            mb = data.slice(start, start + mbs)
            logprobs = self.curr[start : start + mbs].clone().requires_grad_(True)
            loss, metrics = loss_fn(logprobs, mb, global_valid_seqs, global_valid_toks)
            loss.backward()
            self.calls.append({"data": mb, "loss": loss.detach(), "grad": logprobs.grad, "metrics": metrics})
        return {"calls": len(self.calls)}


class _Worker(AISTrainMixin, _MegatronStandIn):
    def _ais_dp_group(self):
        return dist.group.WORLD


@pytest.fixture(scope="module")
def one_rank_world(tmp_path_factory):
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(raw: dict, seed: int = 0) -> list[dict]:
    data, curr = _batch(seed)
    worker = _Worker({"train_global_batch_size": GBS}, curr)
    worker.train(data, AISClippedPGLossFn(raw["loss_fn"]), gbs=GBS, mbs=MBS)
    return worker.calls


def _upstream(raw: dict, call: dict, curr: torch.Tensor, start: int) -> tuple:
    """Upstream's real ClippedPGLossFn on the same micro-batch (without our row tags)."""
    data, _ = _batch()
    mb = data.slice(start, start + MBS)
    assert GLOBAL_BATCH_KEY not in mb
    mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
    logprobs = curr[start : start + MBS].clone().requires_grad_(True)
    loss_fn = ClippedPGLossFn(ClippedPGLossConfig(**raw["loss_fn"]))
    loss, metrics = loss_fn(logprobs, mb, data["sample_mask"].sum(), mask.sum())
    loss.backward()
    return loss.detach(), logprobs.grad, metrics


@pytest.mark.parametrize("model", MODELS)
def test_every_arm_reports_the_same_ais_telemetry(arms, one_rank_world, model):
    _, curr = _batch()
    per_arm = {arm: _train(arms[model][arm]) for arm in ARMS}
    reference = per_arm["bf16"]
    for arm, calls in per_arm.items():
        assert len(calls) == GBS // MBS, arm
        for call, ref in zip(calls, reference, strict=True):
            ais = {k: v for k, v in call["metrics"].items() if k.startswith("ais/")}
            ref_ais = {k: v for k, v in ref["metrics"].items() if k.startswith("ais/")}
            assert ais, f"{arm}: no ais/* telemetry"
            assert ais == ref_ais, arm  # same statistics, whatever the correction mode
            assert call["metrics"]["ais/n_tok"] > 0
    for arm in ARMS:
        if arms[model][arm]["loss_fn"]["ais"]["mode"] != "none":
            continue
        for i, call in enumerate(per_arm[arm]):
            loss, grad, metrics = _upstream(arms[model][arm], call, curr, i * MBS)
            assert torch.equal(call["loss"], loss), (arm, i)
            assert torch.equal(call["grad"], grad), (arm, i)
            assert {k: call["metrics"][k] for k in metrics} == metrics, (arm, i)
