# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Recording stand-ins for what NeMo-RL v0.7.0's GRPO driver cannot do on a CPU machine.

``from _ray_boundary import ...`` (pytest puts ``tests/upstream`` on ``sys.path``). Each
stand-in replaces one name, in the module where upstream looks it up, and records what
crosses it; everything between the stand-ins is upstream's real code.

* :class:`DriverBoundary`: what ``launchers/run_grpo_ais.py`` ``main()`` calls outside
  ``setup()``: ``init_ray`` (starts Ray), ``get_tokenizer`` (HF download),
  ``setup_response_data`` (dataset download; returns tiny in-memory datasets),
  ``grpo_train`` / ``async_grpo_train`` (the GPU loops) and, on NeMo-RL main,
  ``shutdown_environments`` (stops the environments' Ray actors).
* :class:`ActorBoundary`: actor creation. ``RayQueue`` / ``RayWorkerGroup`` in
  ``nemo_rl.models.policy.lm_policy`` (``Policy.__init__``), ``VllmGeneration`` in
  ``nemo_rl.algorithms.grpo`` (vLLM engines; its worker group runs what ``__ray_call__`` /
  ``collective_rpc`` are given in a fresh interpreter with the driver's environment), ``RayGpuMonitorLogger`` in
  ``nemo_rl.utils.logger`` (a Ray metrics thread), ``get_default_hf_config`` in
  ``lm_policy`` (an HF download; answered with a real ``transformers`` config of the
  model's shapes from ``nemo_ais.preflight.MODEL_SHAPES``). ``RayVirtualCluster`` stays
  upstream's real class (its constructor creates no placement group; the recorder
  subclass only notes its arguments). The worker group answers what ``setup()`` asks of
  the workers with ``ray.put`` refs, so upstream's ``ray.get`` runs unpatched (needs the
  ``local_ray`` fixture); with ``stop=True`` it raises :class:`AtRayBoundary` instead.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nemo_rl.algorithms import grpo
from nemo_rl.distributed import ray_actor_environment_registry as registry
from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl.models.policy import lm_policy
from nemo_rl.utils import logger as nrl_logger

from nemo_ais.preflight import find_model_shape

REPO_ROOT = Path(__file__).resolve().parents[2]
MEGATRON_BASE = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"
MEGATRON_AIS_WORKER = "nemo_ais.nemo_rl.workers.megatron.AISMegatronPolicyWorker"
# NeMo-RL's ModelOpt QAT Megatron worker (policy.quant_cfg: QARL) and ours on it
MEGATRON_QUANT_BASE = "nemo_rl.modelopt.models.policy.workers.megatron_quant_policy_worker.MegatronQuantPolicyWorker"
MEGATRON_QUANT_AIS_WORKER = "nemo_ais.nemo_rl.workers.megatron_quant.AISMegatronQuantPolicyWorker"
# what the stand-in workers answer to prepare_refit_info (name -> (shape, dtype))
REFIT_INFO = {"model.embed_tokens.weight": ((16, 8), "torch.bfloat16")}


class AtRayBoundary(Exception):
    """Raised by the stopping ``RayWorkerGroup``: nothing past it needs Ray."""


class Tokenizer:
    """What ``configure_generation_config`` and ``Policy`` read from a tokenizer (Qwen3's ids)."""

    pad_token_id = 151643
    eos_token_id = 151645


def cluster_for(cluster_cfg: dict) -> RayVirtualCluster:
    """Upstream's real ``RayVirtualCluster`` of a ``cluster`` section (no placement group yet)."""
    return RayVirtualCluster(
        bundle_ct_per_node_list=[cluster_cfg["gpus_per_node"]] * cluster_cfg["num_nodes"],
        num_gpus_per_node=cluster_cfg["gpus_per_node"],
        name="test_cluster",
    )


def build_policy(factory, raw: dict) -> None:
    """Call a policy factory as ``grpo.setup()`` does for ``raw``; it must stop at the Ray
    boundary (the ``ActorBoundary`` raises :class:`AtRayBoundary` where actors would start)."""
    with pytest.raises(AtRayBoundary):
        factory(
            cluster=cluster_for(raw["cluster"]),
            config=copy.deepcopy(raw["policy"]),
            tokenizer=None,
            processor=None,
            weights_path=None,
            optimizer_path=None,
            init_optimizer=True,
            init_reference_model=False,
        )


def tiny_datasets(raw: dict) -> tuple[list[dict], list[dict]]:
    """In-memory train / validation datasets: two dataloader batches, one validation batch."""

    def datum(i: int, task: str = "math") -> dict:
        return {
            "message_log": [],
            "length": 4,
            "extra_env_info": {"ground_truth": str(i)},
            "loss_multiplier": 1.0,
            "idx": i,
            "task_name": task,
        }

    grpo_cfg = raw["grpo"]  # .get: a test may have dropped a key for upstream to miss
    per_step = grpo_cfg.get("num_prompts_per_step", 1)
    if grpo_cfg.get("use_dynamic_sampling"):
        per_step = int(per_step * grpo_cfg.get("batch_multiplier", 1))
    return [datum(i) for i in range(2 * per_step)], [datum(i) for i in range(grpo_cfg.get("val_batch_size", 1))]


class DriverBoundary:
    """Recording stand-ins for the cluster / download / GPU calls of ``main()`` around setup."""

    def __init__(self, datasets: tuple = ()) -> None:
        self.events: list[tuple[str, dict]] = []
        self.tokenizer = Tokenizer()
        self.datasets = datasets or (object(), object(), {"math": object()}, {"math": object()})

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def event(self, name: str) -> dict:
        (found,) = [e for n, e in self.events if n == name]
        return found

    def init_ray(self, *args, **kwargs):
        env = {k: os.environ.get(k) for k in ("PYTHONPATH", "NEMO_AIS_REFIT")}
        self.events.append(("init_ray", {"args": args, "kwargs": kwargs, "env": env}))

    def get_tokenizer(self, tokenizer_config, *args, **kwargs):
        self.events.append(("get_tokenizer", {"config": copy.deepcopy(tokenizer_config)}))
        return self.tokenizer

    def setup_response_data(self, tokenizer, data_config, env_configs=None, *args, **kwargs):
        self.events.append(("setup_response_data", {"tokenizer": tokenizer, "data": data_config, "env": env_configs}))
        return self.datasets

    def grpo_train(self, *args):
        self.events.append(("grpo_train", {"args": args}))

    def async_grpo_train(self, **kwargs):
        self.events.append(("async_grpo_train", kwargs))

    def shutdown_environments(self, task_to_env, val_task_to_env):
        self.events.append(("shutdown_environments", {"envs": (task_to_env, val_task_to_env)}))

    def install(self, monkeypatch, module: Any = None) -> None:
        """Replace the names ``main()`` looks up: in their modules (our launcher imports them
        at call time) or, given ``module`` (upstream's ``examples/run_grpo.py``), in it."""
        import nemo_rl.algorithms.utils as nrl_algo_utils
        import nemo_rl.data.utils as nrl_data_utils
        import nemo_rl.distributed.virtual_cluster as nrl_virtual_cluster

        for home, name in (
            (nrl_virtual_cluster, "init_ray"),
            (nrl_algo_utils, "get_tokenizer"),
            (nrl_data_utils, "setup_response_data"),
            (grpo, "grpo_train"),
            (grpo, "async_grpo_train"),
            (grpo, "shutdown_environments"),  # main only
        ):
            if not hasattr(home, name):
                continue
            target = module if module is not None and hasattr(module, name) else home
            monkeypatch.setattr(target, name, getattr(self, name))


class _WorkerGroup:
    """Stand-in ``RayWorkerGroup``: one answer per rank for what ``setup()`` asks."""

    def __init__(self, boundary: ActorBoundary, cluster, builder, **kwargs) -> None:
        self.boundary = boundary
        self.cluster = cluster
        self.builder = builder
        self.kwargs = kwargs
        self.calls: list[tuple[str, tuple, dict]] = []

    def _answer(self, method: str, rank: int) -> Any:
        per_node = self.cluster.num_gpus_per_node
        if method == "report_node_ip_and_gpu_id":
            return (f"10.0.0.{rank // per_node}", rank % per_node)
        if method == "prepare_refit_info":
            return copy.deepcopy(REFIT_INFO)
        raise AssertionError(f"setup() asked the policy workers for {method!r}: not stood in")

    def run_all_workers_single_data(self, method_name: str, *args, **kwargs) -> list:
        import ray

        self.calls.append((method_name, args, kwargs))
        return [ray.put(self._answer(method_name, rank)) for rank in range(self.cluster.world_size())]

    def shutdown(self, *args, **kwargs) -> bool:
        self.calls.append(("shutdown", args, kwargs))
        return True


# what a fresh vLLM worker process answers, per environment (PYTHONPATH, refit JSON)
_WORKER_ANSWERS: dict[tuple[str, str], bytes] = {}
# The engine's GPU, as CUDA would report it in a vLLM worker (stood in: this machine has
# none): ENGINE_GPU["gpu"] is the name and compute capability every engine process reports.
H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
B200 = ("NVIDIA B200", (10, 0))
ENGINE_GPU = {"gpu": H100}


def gpu_for_config(raw: dict) -> tuple[str, tuple[int, int]]:
    """The GPU a shipped config's header names: B200 where Hopper cannot run the format."""
    from nemo_ais.preflight.checks.formats import rollout_format
    from nemo_ais.rules.native_kernels import HOPPER, NATIVE_KERNELS

    need = NATIVE_KERNELS.get(rollout_format(raw))
    return B200 if need is not None and need.min_capability > HOPPER else H100


_RUN_IN_WORKER = (
    "import os, pickle, sys, torch; name, cc = pickle.loads(bytes.fromhex(os.environ["
    "'STANDIN_CUDA_DEVICE'])); torch.cuda.is_available = lambda: True; "
    "torch.cuda.get_device_name = lambda *a: name; "
    "torch.cuda.get_device_capability = lambda *a: cc; "
    "fn = pickle.loads(sys.stdin.buffer.read()); "
    "sys.stdout.buffer.write(pickle.dumps(fn(None)))"
)


class _EngineWorkerProcess:
    """vLLM's ``LLM.collective_rpc(callable)`` (one engine worker): runs the callable in a
    fresh interpreter started with the driver's environment at that moment, which is what
    ``init_ray`` hands every Ray worker (the vLLM worker processes inherit it), where
    ``torch.cuda`` reports :data:`ENGINE_GPU` (the one thing stood in there)."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert not args and not kwargs
        self.calls.append(("collective_rpc", method.__qualname__))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), str(REPO_ROOT)])
        env["STANDIN_CUDA_DEVICE"] = pickle.dumps(ENGINE_GPU["gpu"]).hex()
        key = (env["PYTHONPATH"], env.get("NEMO_AIS_REFIT", ""), pickle.dumps(method), env["STANDIN_CUDA_DEVICE"])
        if key not in _WORKER_ANSWERS:
            out = subprocess.run(
                [sys.executable, "-c", _RUN_IN_WORKER], input=key[2], env=env, capture_output=True, timeout=120
            )
            assert out.returncode == 0, out.stderr.decode()
            _WORKER_ANSWERS[key] = out.stdout
        return [pickle.loads(_WORKER_ANSWERS[key])]


class _GenerationWorkerGroup:
    """Stand-in of the engines' ``RayWorkerGroup``: ``__ray_call__`` on one generation worker."""

    def __init__(self, calls: list) -> None:
        self.calls = calls
        self.llm = _EngineWorkerProcess(calls)  # the generation worker actor's engine

    def run_all_workers_single_data(self, method_name, run_rank_0_only_axes=None, **kwargs):
        import ray

        assert method_name == "__ray_call__", method_name
        self.calls.append(("__ray_call__", kwargs["fn"].__qualname__))
        return [ray.put(kwargs["fn"](self))]


class _VllmGeneration:
    """Stand-in ``VllmGeneration``: records the engine config it would start."""

    def __init__(self, boundary: ActorBoundary, cluster, config, **kwargs) -> None:
        self.cluster = cluster
        self.config = copy.deepcopy(config)
        self.kwargs = kwargs
        self.calls: list[tuple[str, tuple]] = []
        self.worker_group = _GenerationWorkerGroup(self.calls)
        boundary.generations.append(self)

    def finish_generation(self, *args, **kwargs) -> bool:
        self.calls.append(("finish_generation", args))
        return True

    def shutdown(self) -> bool:  # main's run_grpo.py calls it after training
        self.calls.append(("shutdown", ()))
        return True

    def prepare_refit_info(self, state_dict_info) -> None:
        self.calls.append(("prepare_refit_info", (state_dict_info,)))


class ActorBoundary:
    """Records what reaches Ray actor creation (policy workers, vLLM engines, GPU monitor)."""

    def __init__(self, stop: bool) -> None:
        self.stop = stop
        self.queues: list[tuple] = []
        self.groups: list[dict] = []  # what each RayWorkerGroup got (cluster, builder, kwargs)
        self.worker_groups: list[_WorkerGroup] = []
        self.generations: list[_VllmGeneration] = []
        self.clusters: list[tuple[RayVirtualCluster, dict]] = []
        self.gpu_monitors: list[dict] = []
        self.hf_configs: list[str] = []
        self.venv_python = ""
        self.venv_pythons: dict[str, str] = {}  # upstream worker fqn -> its prebuilt venv
        self.resolved: list[str] = []  # what upstream's resolve_policy_worker_cls returned

    def install(self, monkeypatch, tmp_path: Path) -> ActorBoundary:
        boundary = self
        # main() wraps grpo.refit_policy_generation (its first-refit engine check) and a
        # test may pick the engines' GPU: both restored after the test
        monkeypatch.setattr(grpo, "refit_policy_generation", grpo.refit_policy_generation)
        monkeypatch.setitem(ENGINE_GPU, "gpu", H100)

        def record_group(cluster, builder, **kwargs):
            self.groups.append({"cluster": cluster, "builder": builder, **kwargs})
            if self.stop:
                raise AtRayBoundary
            group = _WorkerGroup(self, cluster, builder, **kwargs)
            self.worker_groups.append(group)
            return group

        class RecordingCluster(RayVirtualCluster):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                boundary.clusters.append((self, kwargs))

        class GpuMonitor:
            def __init__(self, **kwargs):
                self.kwargs = kwargs
                boundary.gpu_monitors.append(kwargs)

            def start(self):
                self.kwargs["started"] = True

            def stop(self):  # upstream's Logger.__del__ calls it
                self.kwargs["stopped"] = True

        def hf_config(model_name: str):
            self.hf_configs.append(model_name)
            return hf_config_of(model_name)

        real_resolve = lm_policy.resolve_policy_worker_cls

        def spy_resolve(default_cls: str, config: dict) -> str:  # a spy: upstream's answer
            self.resolved.append(real_resolve(default_cls, config))
            return self.resolved[-1]

        monkeypatch.setattr(lm_policy, "resolve_policy_worker_cls", spy_resolve)
        monkeypatch.setattr(lm_policy, "RayQueue", lambda *a, **k: self.queues.append((a, k)))
        monkeypatch.setattr(lm_policy, "RayWorkerGroup", record_group)
        monkeypatch.setattr(lm_policy, "get_default_hf_config", hf_config)
        monkeypatch.setattr(grpo, "RayVirtualCluster", RecordingCluster)
        monkeypatch.setattr(grpo, "VllmGeneration", lambda **kw: _VllmGeneration(self, **kw))
        monkeypatch.setattr(nrl_logger, "RayGpuMonitorLogger", GpuMonitor)
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # Policy requires it for Megatron
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        # the container's prebuilt venvs of upstream's Megatron workers, BF16 and ModelOpt
        # (see test_worker_venv.py)
        monkeypatch.setenv("NEMO_RL_VENV_DIR", str(tmp_path / "venvs"))
        monkeypatch.delenv("NRL_FORCE_REBUILD_VENVS", raising=False)
        monkeypatch.setattr(registry, "ACTOR_ENVIRONMENT_REGISTRY", dict(registry.ACTOR_ENVIRONMENT_REGISTRY))
        extras = {MEGATRON_BASE: "--extra mcore", MEGATRON_QUANT_BASE: "--extra modelopt --extra mcore"}
        for base, extra in extras.items():
            venv_python = tmp_path / "venvs" / base / "bin" / "python"
            venv_python.parent.mkdir(parents=True)
            venv_python.touch()
            monkeypatch.setitem(registry.ACTOR_ENVIRONMENT_REGISTRY, base, f"uv run {extra}")
            self.venv_pythons[base] = str(venv_python)
        self.venv_python = self.venv_pythons[MEGATRON_BASE]
        return self


def hf_config_of(model_name: str):
    """A real ``transformers`` config with the model's shapes (what ``AutoConfig`` would load)."""
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

    dims = find_model_shape(model_name)
    assert dims is not None, f"{model_name}: not in nemo_ais.preflight.MODEL_SHAPES"
    common = {
        "hidden_size": dims.hidden_size,
        "num_attention_heads": dims.num_attention_heads,
        "num_key_value_heads": dims.num_key_value_heads,
        "head_dim": dims.head_dim,
        "intermediate_size": dims.intermediate_size,
        "num_hidden_layers": dims.num_layers,
    }
    name = model_name.lower()
    if "llama" in name:
        return LlamaConfig(**common)
    if dims.num_experts:
        return Qwen3MoeConfig(**common, num_experts=dims.num_experts, moe_intermediate_size=dims.moe_intermediate_size)
    return Qwen3Config(**common)
