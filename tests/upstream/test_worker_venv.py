# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Our worker's Python environment through upstream's worker-group resolution (issue 11, defect 5).

NeMo-RL's ``RayWorkerGroup._create_workers_from_bundle_indices`` looks the actor's
fqn up in ``ACTOR_ENVIRONMENT_REGISTRY``; an entry starting with ``uv`` makes it call
``create_local_venv_on_each_node(venv_name=<actor fqn>)``, i.e. build a fresh venv named
after OUR fqn on every node at every job start (the container prebuilds venvs only for
upstream's fqns). Here upstream's real ``RayWorkerGroup.__init__`` runs for the AIS
Megatron worker after our registration (what the policy factory does before ``Policy``).
Recorded at the boundaries: ``create_local_venv_on_each_node`` (both where
``worker_groups`` and ``venvs`` name it) and ``RayWorkerBuilder.IsolatedWorkerInitializer``
(the Ray actor creation, stopped there). The cluster is a stand-in placement group.
"""

from __future__ import annotations

import sys

import nemo_rl  # noqa: F401  (required: tests/conftest.py)
import pytest
from nemo_rl.distributed import ray_actor_environment_registry as registry, worker_groups
from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
from nemo_rl.utils import venvs
from nemo_rl_version import per_version

from nemo_ais.nemo_rl.policy_factory import register_ais_workers

pytestmark = pytest.mark.nemo_rl

BASE = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"
OURS = "nemo_ais.nemo_rl.workers.megatron.AISMegatronPolicyWorker"


class _AtActorCreation(Exception):
    """Raised where Ray would create the worker initializer actor."""


class _Cluster:
    """Stand-in placement group: what ``_create_workers_from_bundle_indices`` reads."""

    def get_master_address_and_port(self):
        return "127.0.0.1", 29500

    def get_placement_groups(self):
        return ["pg0"]

    def get_available_address_and_port(self, pg_idx, bundle_idx):
        return "127.0.0.1", 29501 + bundle_idx

    def get_available_addresses_and_ports_batch(self, pg_bundle_pairs):  # NeMo-RL main
        return [self.get_available_address_and_port(*pair) for pair in pg_bundle_pairs]


def _python_of(initializer: dict) -> dict:
    """The initializer's runtime env without the env vars main adds (HF_HOME, PYTHONPATH)."""
    return {k: v for k, v in initializer["runtime_env"].items() if k != "env_vars"}


@pytest.fixture
def boundary(monkeypatch, tmp_path):
    """Recorders at the venv-build and actor-creation boundaries; a tmp venv dir."""
    seen = {"group_builds": [], "factory_builds": [], "initializers": []}

    def group_build(py_executable, venv_name):
        seen["group_builds"].append((py_executable, venv_name))
        return str(tmp_path / "built" / venv_name / "bin" / "python")

    def factory_build(py_executable, venv_name):
        seen["factory_builds"].append((py_executable, venv_name))
        return str(tmp_path / "venvs" / venv_name / "bin" / "python")

    class Initializer:
        @staticmethod
        def options(**kwargs):
            seen["initializers"].append(kwargs)
            raise _AtActorCreation

    monkeypatch.setattr(worker_groups, "create_local_venv_on_each_node", group_build)
    monkeypatch.setattr(venvs, "create_local_venv_on_each_node", factory_build)
    monkeypatch.setattr(worker_groups.RayWorkerBuilder, "IsolatedWorkerInitializer", Initializer)
    monkeypatch.setattr(registry, "ACTOR_ENVIRONMENT_REGISTRY", dict(registry.ACTOR_ENVIRONMENT_REGISTRY))
    monkeypatch.setenv("NEMO_RL_VENV_DIR", str(tmp_path / "venvs"))
    monkeypatch.delenv("NRL_FORCE_REBUILD_VENVS", raising=False)
    return seen


def _prebuilt(tmp_path, fqn: str = BASE):
    python = tmp_path / "venvs" / fqn / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    return str(python)


def _start_worker_group() -> None:
    """Upstream's real worker group for our worker, up to the Ray actor creation."""
    builder = worker_groups.RayWorkerBuilder(OURS, {"policy": "config"})
    with pytest.raises(_AtActorCreation):
        worker_groups.RayWorkerGroup(_Cluster(), builder, name_prefix="lm_policy", bundle_indices_list=[(0, [0, 1])])


def test_prebuilt_base_venv_is_used_without_a_build(boundary, tmp_path, monkeypatch):
    monkeypatch.setitem(registry.ACTOR_ENVIRONMENT_REGISTRY, BASE, PY_EXECUTABLES.MCORE)
    python = _prebuilt(tmp_path)
    register_ais_workers(OURS)
    _start_worker_group()
    assert boundary["group_builds"] == [] and boundary["factory_builds"] == []
    (initializer,) = boundary["initializers"]
    assert _python_of(initializer) == {"py_executable": python}


def test_system_executable_is_used_as_is(boundary, monkeypatch):
    # NEMO_RL_PY_EXECUTABLES_SYSTEM=1: upstream registers sys.executable, no uv
    monkeypatch.setitem(registry.ACTOR_ENVIRONMENT_REGISTRY, BASE, PY_EXECUTABLES.SYSTEM)
    register_ais_workers(OURS)
    _start_worker_group()
    assert boundary["group_builds"] == [] and boundary["factory_builds"] == []
    (initializer,) = boundary["initializers"]
    # main leaves the driver's own Python out of the runtime env (it is Ray's default)
    assert _python_of(initializer) == per_version(v0_7_0={"py_executable": sys.executable}, main={})


@pytest.mark.parametrize("force", [False, True])
def test_missing_venv_is_built_once_under_the_base_name(boundary, tmp_path, monkeypatch, force):
    monkeypatch.setitem(registry.ACTOR_ENVIRONMENT_REGISTRY, BASE, PY_EXECUTABLES.MCORE)
    if force:  # NRL_FORCE_REBUILD_VENVS: rebuild even a prebuilt venv, as upstream does
        _prebuilt(tmp_path)
        monkeypatch.setenv("NRL_FORCE_REBUILD_VENVS", "true")
    register_ais_workers(OURS)
    _start_worker_group()
    # shared with upstream's own worker: NEMO_RL_VENV_DIR/<base fqn>, never <our fqn>
    assert boundary["factory_builds"] == [(PY_EXECUTABLES.MCORE, BASE)]
    assert boundary["group_builds"] == []
    (initializer,) = boundary["initializers"]
    expected = str(tmp_path / "venvs" / BASE / "bin" / "python")
    assert _python_of(initializer) == {"py_executable": expected}
