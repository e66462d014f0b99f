# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""After ``setup()`` the driver asks every vLLM worker whether the AIS FP8 refit is armed.

``nemo_ais.nemo_rl.refit.require_active`` goes through upstream's REAL dispatch:
``VllmGeneration.worker_group`` (a real ``RayWorkerGroup``, built with ``__new__`` over
real Ray actors) -> ``run_all_workers_single_data("__ray_call__", ...)`` -> each actor ->
vLLM's ``collective_rpc`` into the engine's worker processes. Stood in, recording what
crosses it: the generation worker actor (``_generation_worker.GenerationWorker``, a CPU
actor in place of upstream's GPU ``VllmGenerationWorker``) and vLLM's
``LLM.collective_rpc`` (runs the callable in the actor's own process, where vLLM's
in-process executor would run it). Each actor is a fresh
Ray worker process started with a different environment, so the hook state it reports is
what ``site`` did at that interpreter's start.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import ray
from _generation_worker import AsyncGenerationWorker, GenerationWorker, generation_over
from shipped_configs import CONFIG_DIR, launcher

from nemo_ais.nemo_rl import refit

pytestmark = pytest.mark.nemo_rl

REPO_ROOT = Path(__file__).resolve().parents[2]
run = launcher()


def _env(launcher_env: dict[str, str], drop: str | None) -> dict[str, str]:
    """A worker's environment: the launcher's, with one piece missing (``drop``)."""
    env = {k: launcher_env[k] for k in ("PYTHONPATH", refit.ENV_VAR)}
    stand_in = str(REPO_ROOT / "tests" / "upstream")  # _generation_worker, for Ray
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO_ROOT), stand_in])
    if drop == "hook_dir":  # sitecustomize not on the path (or shadowed)
        hook_dir = str(REPO_ROOT / "nemo_ais" / "nemo_rl" / "_vllm_hook")
        env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if p != hook_dir)
    if drop == "env_var":
        env[refit.ENV_VAR] = ""
    return env


@pytest.fixture(scope="module")
def launcher_env():
    """The worker environment main() sets for the smoke config (configure_fp8_refit)."""
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    raw = run.load_config_dict(str(CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"), [])
    assert run.configure_fp8_refit(raw, env) is not None
    return env


def _started(actor_class, launcher_env, drops, **kwargs):
    """One actor per environment (``drops``: what each lacks, None: as launched)."""
    return {
        drop or "launched": actor_class.options(runtime_env={"env_vars": _env(launcher_env, drop)}).remote(**kwargs)
        for drop in drops
    }


@pytest.fixture(scope="module")
def workers(local_ray, launcher_env):
    """One generation worker per environment: as launched, hook dir missing, env var unset."""
    actors = _started(GenerationWorker, launcher_env, (None, "hook_dir", "env_var"))
    yield actors
    for actor in actors.values():
        ray.kill(actor)


def test_every_vllm_worker_reports_the_armed_refit(workers, caplog):
    generation = generation_over([workers["launched"]])
    with caplog.at_level(logging.WARNING, logger="nemo_ais.nemo_rl.refit"):
        (status,) = refit.require_active(generation)
    assert (status.configured, status.armed, status.imported, status.active) == (True, True, False, True)
    assert status.pid != os.getpid()  # asked in the worker's process, not the driver's
    assert ray.get(workers["launched"].rpc_calls.remote()) == ["hook_status"]
    assert "AIS refit armed in 1 vLLM worker processes of 1 generation workers" in caplog.text


def test_a_worker_without_the_hook_fails_the_run_naming_it(workers, caplog):
    generation = generation_over([workers["launched"], workers["hook_dir"], workers["env_var"]])
    with (
        caplog.at_level(logging.WARNING, logger="nemo_ais.nemo_rl.refit"),
        pytest.raises(RuntimeError, match="not active in every vLLM worker") as err,
    ):
        refit.require_active(generation)
    message = str(err.value)
    assert "generation worker 0" not in message
    assert "generation worker 1, vLLM process" in message and "sitecustomize.py did not run" in message
    assert "generation worker 2, vLLM process" in message and f"{refit.ENV_VAR} is not set" in message
    assert "AIS refit NOT active" in caplog.text  # logged at WARNING as well


@pytest.fixture(scope="module")
def async_workers(local_ray, launcher_env):
    """``vllm_cfg.async_engine``: async generation actors, as launched and without the hook."""
    actors = _started(AsyncGenerationWorker, launcher_env, (None, "hook_dir"))
    no_output_task = _started(AsyncGenerationWorker, launcher_env, (None,), mode="none")
    actors["no_output_task"] = no_output_task["launched"]  # its engine has no running loop
    yield actors
    for actor in actors.values():
        ray.kill(actor)


def test_async_engines_are_asked_too_and_one_without_the_hook_fails_the_run(async_workers):
    # AsyncLLM.collective_rpc is a coroutine: asked on the engine's own event loop
    (status,) = refit.require_active(generation_over([async_workers["launched"]]))
    assert status.active and status.pid != os.getpid()
    assert ray.get(async_workers["launched"].rpc_calls.remote()) == ["hook_status"]
    generation = generation_over([async_workers["launched"], async_workers["hook_dir"]])
    with pytest.raises(RuntimeError, match="generation worker 1, vLLM process") as err:
        run.require_fp8_refit_active(None, generation)
    assert "sitecustomize.py did not run" in str(err.value)


def test_an_async_engine_whose_loop_cannot_be_found_is_left_with_a_warning(async_workers, caplog):
    generation = generation_over([async_workers["no_output_task"]])
    with caplog.at_level(logging.WARNING, logger="nemo_ais.nemo_rl.refit"):
        run.require_fp8_refit_active(None, generation)  # the run goes on
    assert "not asked whether the AIS refit is armed" in caplog.text
    assert "no running output task" in caplog.text
