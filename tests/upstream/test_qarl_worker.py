# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The AIS worker on NeMo-RL's ModelOpt QAT Megatron worker (QARL), v0.7.0 and main.

``policy.quant_cfg`` makes upstream's ``Policy`` resolve ``MegatronQuantPolicyWorker``
(``resolve_policy_worker_cls``); our factory must hand it
``nemo_ais.nemo_rl.workers.megatron_quant.AISMegatronQuantPolicyWorker``, a subclass of
that class (as ``Policy`` asks of a ``worker_extension_cls_fqn``) whose ``train()`` runs the
AIS prepare step before upstream's. Upstream's quant worker module is imported for real on
CPU, with import-time placeholders for ``megatron.bridge.*`` and ``modelopt.*`` (neither
installable here; ``tests/_megatron_worker.py``); no placeholder may be called.
``Policy.__init__`` runs for real up to Ray actor creation (``_ray_boundary``), with a spy
on upstream's ``resolve_policy_worker_cls``. The whole ``setup()`` on the shipped QARL
config: ``tests/upstream/test_setup_real.py``.
"""

from __future__ import annotations

import importlib

import nemo_rl  # noqa: F401  (required: tests/conftest.py)
import pytest
from _megatron_worker import Placeholder, megatron_worker_modules
from _ray_boundary import MEGATRON_QUANT_AIS_WORKER, MEGATRON_QUANT_BASE, ActorBoundary, build_policy
from nemo_rl.distributed import ray_actor_environment_registry as registry
from nemo_rl.models.policy.utils import resolve_policy_worker_cls
from shipped_configs import CONFIG_DIR, launcher

from nemo_ais.nemo_rl.policy_factory import ais_worker_fqn, make_policy_factory
from nemo_ais.nemo_rl.workers import AIS_WORKER_FQNS
from nemo_ais.nemo_rl.workers.mixin import AISTrainMixin

pytestmark = pytest.mark.nemo_rl

MEGATRON_BASE = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"
QARL_CONFIG = CONFIG_DIR / "experiments" / "qwen3_8b_nvfp4_qarl_tbpo.yaml"


@pytest.fixture(scope="module")
def quant_modules():
    """Upstream's ModelOpt QAT worker module and ours on it, imported on CPU."""
    Placeholder.used.clear()
    with megatron_worker_modules(quant=True) as modules:
        yield modules
    assert Placeholder.used == [], "a placeholder was called"


def _actor_class(fqn: str) -> type:
    """The class under the ``@ray.remote`` wrapper of ``module.Name``."""
    module, name = fqn.rsplit(".", 1)
    return getattr(importlib.import_module(module), name).__ray_actor_class__


def test_quant_cfg_picks_the_ais_worker_on_upstreams_resolution():
    qarl = {"megatron_cfg": {"enabled": True}, "quant_cfg": "nvfp4_a16_mlp_only.yaml"}
    upstream = resolve_policy_worker_cls(MEGATRON_BASE, qarl)
    assert upstream == MEGATRON_QUANT_BASE  # upstream's own table, not ours
    assert ais_worker_fqn(qarl) == AIS_WORKER_FQNS[upstream] == MEGATRON_QUANT_AIS_WORKER
    plain = {"megatron_cfg": {"enabled": True}}
    assert ais_worker_fqn(plain) == AIS_WORKER_FQNS[resolve_policy_worker_cls(MEGATRON_BASE, plain)]


def test_our_class_extends_upstreams_quant_worker_with_the_prepare_step_first(quant_modules):
    ours = quant_modules.ours.AISMegatronQuantPolicyWorker.__ray_actor_class__
    upstream = quant_modules.upstream.MegatronQuantPolicyWorker.__ray_actor_class__
    from nemo_ais.nemo_rl.workers.megatron import AISMegatronMixin

    assert quant_modules.ours.MegatronQuantPolicyWorkerImpl is upstream
    assert issubclass(ours, upstream) and issubclass(ours, AISTrainMixin)
    assert issubclass(upstream, quant_modules.base.MegatronPolicyWorkerImpl)
    mro = ours.__mro__
    assert mro.index(AISTrainMixin) < mro.index(upstream)  # our train() runs first
    assert ours.train is AISTrainMixin.train  # ... and its super() is upstream's train()
    assert ours.begin_train_step is AISTrainMixin.begin_train_step
    assert ours.save_checkpoint is AISTrainMixin.save_checkpoint
    # super() from ours reaches upstream's QAT __init__ (quantize, restore ModelOpt state)
    # and its save_checkpoint (without_model_config) before the BF16 worker's
    after_ours = mro[mro.index(AISTrainMixin) + 1 :]
    for name in ("__init__", "save_checkpoint"):
        assert next(c for c in after_ours if name in vars(c)) is upstream, name
    # the BF16 worker's KV calibration and refit scale check apply unchanged
    for name in ("calibrate_qkv_fp8_scales", "stream_weights_via_ipc_zmq", "_ais_dp_group"):
        assert getattr(ours, name) is getattr(AISMegatronMixin, name), name
    # upstream's QAT overrides are kept: the fake-quant / real-quant refit, the contexts
    for name in ("_iter_params_with_optional_kv_scales", "use_reference_model", "generate"):
        assert getattr(ours, name) is getattr(upstream, name), name


def test_upstreams_policy_builds_the_ais_worker_of_the_class_it_resolved(quant_modules, monkeypatch, tmp_path):
    run = launcher()
    raw = run.load_config_dict(str(QARL_CONFIG), [])
    boundary = ActorBoundary(stop=True).install(monkeypatch, tmp_path)
    factory = make_policy_factory(raw)
    build_policy(factory, raw)
    assert boundary.resolved == [MEGATRON_QUANT_BASE]  # upstream's Policy, before extension
    (group,) = boundary.groups
    assert group["builder"].ray_actor_class_fqn == MEGATRON_QUANT_AIS_WORKER
    # what Policy asks ("please make sure it is a subclass of ..."), through the fqns
    assert issubclass(_actor_class(MEGATRON_QUANT_AIS_WORKER), _actor_class(MEGATRON_QUANT_BASE))
    # the AIS worker runs in the prebuilt venv of upstream's ModelOpt worker
    python = registry.get_actor_python_env(MEGATRON_QUANT_AIS_WORKER)
    assert python == boundary.venv_pythons[MEGATRON_QUANT_BASE]
