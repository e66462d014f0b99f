# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""launchers/run_grpo_ais.py main() through NeMo-RL v0.7.0's REAL ``grpo.setup()``, every config.

``tests/upstream/test_driver_main.py`` stops at ``grpo.setup`` (fast, many variants). Here
``setup()`` is upstream's own, run to its ``return`` for every full config under
``configs/nemo_rl/`` whose rollout format this NeMo-RL has (the others, NVFP4 W4A4 and
MXFP8 on v0.7.0, are refused before Ray, naming the field and the version): its logger
(tensorboard, under ``tmp_path``), checkpoint manager,
``StatefulDataLoader`` over tiny in-memory datasets, ``ClippedPGLossFn``, the FP8 /
KV-cache / pipeline / batch asserts, the real ``RayVirtualCluster`` (no placement group
is created), ``init_policy`` -> our ``policy_factory`` -> upstream's real ``Policy`` and
``RayWorkerBuilder``, ``prepare_refit_info`` and the timing log.

``setup()`` calls, in order (v0.7.0; what is real, what is stood in, see ``_ray_boundary``):
``set_seed`` real; ``Logger`` real (``RayGpuMonitorLogger``, a Ray metrics thread, stood in
when ``logger.monitor_gpus``); ``CheckpointManager`` + ``get_latest_checkpoint_path`` +
``load_training_info`` + ``get_resume_paths`` real; ``StatefulDataLoader`` real (datasets
from the stood-in ``setup_response_data``); ``ClippedPGLossFn`` real;
``extract_necessary_env_names``, ``_should_use_nemo_gym``, ``opd`` checks,
``prepare_segment_topology`` real (no Ray with ``segment_size: null``);
``RayVirtualCluster`` real (recorded); ``VllmGeneration`` + ``finish_generation`` +
``prepare_refit_info`` STOOD IN (vLLM engines on GPUs); ``configure_vllm_for_router_replay``
real; ``policy_factory`` (ours) -> ``Policy.__init__`` real up to ``RayQueue`` /
``RayWorkerGroup`` (STOOD IN: actor creation) and ``get_default_hf_config`` (STOOD IN: HF
download; a real ``transformers`` config of the model's shapes); ``FLOPTracker`` real;
``policy.print_node_ip_and_gpu_id`` / ``policy.prepare_refit_info`` real, their
``ray.get`` on the stood-in workers' ``ray.put`` answers real (local Ray, 1 CPU);
``logger.log_metrics`` real. Not on any shipped config's path (not colocated, NeMo-Gym,
OPD teachers, SGLang / Megatron generation backends) is not exercised.

``cluster_check.ENTRY_POINT_KEYS`` is tied to this real path both ways: each key, dropped
from the smoke config (its feature flag on), stops upstream's real code (``MasterConfig``'s
schema before Ray, or a ``KeyError`` inside NeMo-RL after Ray started) and is reported by
cluster_check offline, except the keys read only after ``setup()`` (``READ_AFTER_SETUP``,
checked against upstream's source); and a sweep over every key of the smoke config finds no
unlisted key whose absence is a ``KeyError`` after Ray started.
"""

from __future__ import annotations

import copy
import os
import sys
import traceback
import typing
from pathlib import Path

import pytest
from _ray_boundary import (
    ENGINE_GPU,
    MEGATRON_AIS_WORKER,
    MEGATRON_BASE,
    MEGATRON_QUANT_AIS_WORKER,
    MEGATRON_QUANT_BASE,
    REFIT_INFO,
    ActorBoundary,
    DriverBoundary,
    Tokenizer,
    gpu_for_config,
    tiny_datasets,
)
from nemo_rl.algorithms import grpo
from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn
from nemo_rl.distributed import ray_actor_environment_registry as registry
from nemo_rl.models.generation import configure_generation_config
from nemo_rl.models.policy.lm_policy import Policy
from nemo_rl.utils.checkpoint import CheckpointManager
from nemo_rl.utils.logger import Logger
from nemo_rl_version import NEMO_RL, per_version
from pydantic import ValidationError
from shipped_configs import CONFIG_DIR, FULL_CONFIGS, RUNS_ON, configs_for, flat, launcher, write_input_amax_files

from nemo_ais import preflight as cc
from nemo_ais.nemo_rl import AISClippedPGLossFn
from nemo_ais.nemo_rl.policy_factory import ais_worker_fqn
from nemo_ais.nemo_rl.run_config import RUN_MARKER_KEY, AISMasterConfig, ais_master_config
from nemo_ais.preflight.checks.formats import rollout_format
from nemo_ais.rules.native_kernels import NATIVE_KERNELS

pytestmark = pytest.mark.nemo_rl

run = launcher()
SMOKE = CONFIG_DIR / "smoke_qwen3_0.6b_1n.yaml"
# What each comparison arm trains with: (loss_fn.ais.mode, NeMo-RL's
# use_importance_sampling_correction) on the loss object that reaches grpo_train. The
# uncorrected FP8 arm must have NeMo-RL's IS off too, or it is not uncorrected.
ARMS = {
    "bf16": ("none", False),
    "fp8_none": ("none", False),
    "fp8_tis": ("tis", False),
    "fp8_ais": ("ais", False),
    "qarl_tbpo": ("tbpo", False),  # NeMo-RL's QARL trainer (policy.quant_cfg) + our TBPO
}
ARM_OF = {f"experiments/{model}_{arm}.yaml": arm for model in ("qwen3_8b", "smoke") for arm in ARMS}
ARM_OF["experiments/qwen3_8b_nvfp4_qarl_tbpo.yaml"] = "qarl_tbpo"
# The NeMo-RL worker upstream's Policy resolves (resolve_policy_worker_cls) -> ours on it.
WORKERS = {
    False: (MEGATRON_BASE, MEGATRON_AIS_WORKER),
    True: (MEGATRON_QUANT_BASE, MEGATRON_QUANT_AIS_WORKER),  # policy.quant_cfg: QARL
}
# After training, as each version's run_grpo.py: main flushes the checkpointer (main()
# trains inside ``with checkpointer``) and stops the environments; v0.7.0 does neither.
AFTER_TRAINING = per_version(v0_7_0=[], main=["checkpointer.shutdown", "shutdown_environments"])


class _Run:
    """Everything recorded while ``main()`` ran with upstream's real ``setup()``."""

    def __init__(self, driver: DriverBoundary, actors: ActorBoundary) -> None:
        self.driver = driver
        self.actors = actors
        self.setup_calls: list[dict] = []
        self.factory_calls: list[dict] = []


@pytest.fixture
def real_setup(monkeypatch, tmp_path, local_ray):
    """Install the boundaries; spy (not stub) on ``grpo.setup`` and our policy factory."""
    actors = ActorBoundary(stop=False).install(monkeypatch, tmp_path)
    rec = _Run(DriverBoundary(), actors)

    def use_config(raw: dict) -> None:
        train, val = tiny_datasets(raw)
        rec.driver.datasets = (train, val, {"math": None}, {"math": None})

    rec.use_config = use_config
    rec.driver.install(monkeypatch)

    real = grpo.setup

    def spy_setup(*args, **kwargs):
        call = {"args": args, "kwargs": kwargs}
        rec.setup_calls.append(call)
        call["returned"] = real(*args, **kwargs)
        return call["returned"]

    monkeypatch.setattr(grpo, "setup", spy_setup)

    real_factory = run.make_policy_factory

    def spy_make_policy_factory(config):
        factory = real_factory(config)

        def spy_factory(**kwargs):
            call = {"kwargs": kwargs}
            rec.factory_calls.append(call)
            call["returned"] = factory(**kwargs)
            return call["returned"]

        return spy_factory

    monkeypatch.setattr(run, "make_policy_factory", spy_make_policy_factory)
    if hasattr(CheckpointManager, "shutdown"):  # main: a spy on the real flush
        real_shutdown = CheckpointManager.shutdown

        def spy_shutdown(self):
            rec.driver.events.append(("checkpointer.shutdown", {"manager": self}))
            return real_shutdown(self)

        monkeypatch.setattr(CheckpointManager, "shutdown", spy_shutdown)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    for name in ("NEMO_AIS_REFIT", "NRL_IGNORE_TP_ACCURACY_CHECK"):  # setup() may set them: removed at teardown
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # logger.log_dir / checkpoint_dir are relative
    write_input_amax_files(tmp_path)  # W4A4: the launcher reads its calibration before Ray
    return rec


def _rel(path) -> str:
    return str(path.relative_to(CONFIG_DIR))


def _main(rec: _Run, path, overrides=()) -> dict:
    raw = run.load_config_dict(str(path), list(overrides))
    rec.use_config(raw)
    ENGINE_GPU["gpu"] = gpu_for_config(raw)  # the GPU the config's header names
    run.main(["--config", str(path), *overrides])
    return raw


@pytest.mark.parametrize("path", configs_for(NEMO_RL), ids=_rel)
def test_main_runs_upstreams_real_setup_to_its_return(real_setup, path):
    rec = real_setup
    raw = _main(rec, path)
    ais_cfg = run.validate_ais(raw)
    assert rec.driver.names() == ["init_ray", "get_tokenizer", "setup_response_data", "grpo_train", *AFTER_TRAINING]

    # ---- setup() ran to its return; main swapped the loss it returned
    (setup_call,) = rec.setup_calls
    config = setup_call["args"][0]
    (policy, generation, nemo_gym, clusters, dataloader, val_dataloader, loss_fn, logger,
     checkpointer, state, master_config, teachers, aliases) = setup_call["returned"]  # fmt: skip
    assert type(loss_fn) is ClippedPGLossFn
    train_args = rec.driver.event("grpo_train")["args"]
    assert isinstance(train_args[5], AISClippedPGLossFn)
    assert train_args[5].ais == ais_cfg.ais
    assert train_args[0] is policy and train_args[1] is generation
    assert master_config is config and train_args[11] is config
    # what setup() logged and grpo_train checkpoints: the user's loss_fn + the marker
    assert isinstance(config, AISMasterConfig)
    assert config.model_dump()["loss_fn"] == raw["loss_fn"]
    assert config.model_dump()[RUN_MARKER_KEY]["mode"] == ais_cfg.ais.mode
    assert (nemo_gym, teachers, aliases) == (None, {}, {})
    # a fresh run's save state: a dict on v0.7.0, main's GRPOSaveState dataclass
    initial = per_version(v0_7_0="_default_grpo_save_state", main="_initial_grpo_save_state")
    assert state == getattr(grpo, initial)()

    # ---- the loss grpo_train trains with: each arm's correction, NeMo-RL's own IS off
    trained = train_args[5]
    arm = ARM_OF.get(_rel(path), "fp8_ais")  # model configs run mode ais
    assert (trained.ais.mode, trained.use_importance_sampling_correction) == ARMS[arm]
    assert trained.truncated_importance_sampling_type is None
    assert trained.sequence_level_importance_ratios is False
    assert trained.enabled is (ARMS[arm][0] != "none")

    # ---- upstream's FP8 guard read the view's flag (our loss owns the correction)
    vllm_cfg = config.policy["generation"]["vllm_cfg"]
    assert config.loss_fn.use_importance_sampling_correction is True
    assert raw["loss_fn"]["use_importance_sampling_correction"] is False
    if raw["policy"]["generation"]["vllm_cfg"]["precision"] == "fp8":
        assert vllm_cfg["precision"] == "fp8"  # setup's assert on the flag passed above

    # ---- our policy_factory built upstream's Policy with the AIS worker
    (factory_call,) = rec.factory_calls
    assert factory_call["returned"] is policy and type(policy) is Policy
    kwargs = factory_call["kwargs"]
    train_cluster, inference_cluster = clusters
    assert train_cluster is inference_cluster  # every shipped config is colocated
    assert kwargs["cluster"] is train_cluster and kwargs["config"] is config.policy
    assert kwargs["tokenizer"] is rec.driver.tokenizer
    assert kwargs["init_optimizer"] is True
    assert kwargs["init_reference_model"] is (raw["loss_fn"]["reference_policy_kl_penalty"] > 0)
    assert (kwargs["weights_path"], kwargs["optimizer_path"]) == (None, None)
    (group,) = rec.actors.groups
    builder = group["builder"]
    base, ours = WORKERS[raw["policy"].get("quant_cfg") is not None]
    assert (arm == "qarl_tbpo") is (base == MEGATRON_QUANT_BASE)
    assert builder.ray_actor_class_fqn == ais_worker_fqn(raw["policy"]) == ours
    assert rec.actors.resolved == [base]  # what upstream's Policy picked before our extension
    assert builder.args[0] is config.policy
    assert builder.kwargs["tokenizer"] is rec.driver.tokenizer
    assert registry.get_actor_python_env(ours) == rec.actors.venv_pythons[base]
    assert len(rec.actors.queues) == 1
    assert rec.actors.hf_configs == [raw["policy"]["model_name"]]
    assert policy.flops_tracker is not None  # upstream's FLOPTracker on the model's shapes
    mcfg = raw["policy"]["megatron_cfg"]
    model_parallel = (
        mcfg["tensor_model_parallel_size"] * mcfg["pipeline_model_parallel_size"] * mcfg["context_parallel_size"]
    )
    world = raw["cluster"]["num_nodes"] * raw["cluster"]["gpus_per_node"]
    assert policy.data_parallel_size == world // model_parallel
    # setup's scheduler length: min(max_num_steps, max_num_epochs x 2 dataloader batches)
    assert config.policy["megatron_cfg"]["train_iters"] == min(
        raw["grpo"]["max_num_steps"], raw["grpo"]["max_num_epochs"] * 2
    )
    (worker_group,) = rec.actors.worker_groups
    assert [c[0] for c in worker_group.calls] == ["report_node_ip_and_gpu_id", "prepare_refit_info"]

    # ---- the real RayVirtualCluster; nothing asked Ray for a placement group
    ((cluster, cluster_kwargs),) = rec.actors.clusters
    assert cluster is train_cluster
    gpus = raw["cluster"]["gpus_per_node"]
    assert cluster_kwargs["bundle_ct_per_node_list"] == [gpus] * raw["cluster"]["num_nodes"]
    assert cluster_kwargs["max_colocated_worker_groups"] == 2  # vLLM backend
    assert cluster._node_placement_groups is None

    # ---- vLLM got the configured generation config (configure_generation_config's output)
    (vllm,) = rec.actors.generations
    assert vllm is generation and vllm.cluster is inference_cluster
    expected = configure_generation_config(
        copy.deepcopy(raw["policy"]["generation"]),
        Tokenizer(),
        has_refit_draft_weights=False,
        trains_mtp=bool(mcfg.get("mtp_num_layers")),
    )
    assert vllm.config["vllm_cfg"] == expected["vllm_cfg"] == vllm_cfg
    assert vllm.config["vllm_cfg"]["load_format"] == "dummy"
    assert vllm.config["model_name"] == raw["policy"]["model_name"]
    assert vllm.config["vllm_kwargs"]["hf_overrides"] == raw["policy"].get("hf_config_overrides", {})
    # every FP8 config arms the AIS FP8 refit (test_fp8_refit_configs.py), every NVFP4 one
    # the NVFP4 refit (ais_nvfp4_refit); main() then asks each vLLM worker process (a fresh
    # interpreter with main()'s environment) before training
    asked = [("__ray_call__", "_engine_statuses"), ("collective_rpc", "hook_status")]
    armed = raw["policy"]["generation"]["vllm_cfg"]["precision"] == "fp8"
    armed |= bool((raw.get("ais_nvfp4_refit") or {}).get("enabled", False))
    # and, for a low-precision rollout, each vLLM worker process's GPU (engine_report)
    gpus = [("__ray_call__", "_engine_gpus"), ("collective_rpc", "_gpu_only")]
    low_precision = rollout_format(raw) in NATIVE_KERNELS
    assert vllm.calls == [
        ("finish_generation", ()),
        ("prepare_refit_info", (REFIT_INFO,)),
        *(asked if armed else []),
        *(gpus if low_precision else []),
        *per_version(v0_7_0=[], main=[("shutdown", ())]),  # main's run_grpo.py stops it
    ]
    if AFTER_TRAINING:  # the checkpointer setup() built is the one flushed
        assert rec.driver.event("checkpointer.shutdown")["manager"] is checkpointer

    # ---- logger, checkpointer, dataloaders: upstream's, on the tmp dirs
    assert isinstance(logger, Logger) and isinstance(checkpointer, CheckpointManager)
    log_dir = config.logger["log_dir"]
    assert os.path.isdir(os.path.join(log_dir, "tensorboard"))
    assert [m.get("started") for m in rec.actors.gpu_monitors] == ([True] if raw["logger"]["monitor_gpus"] else [])
    assert len(dataloader) == 2 and dataloader.batch_size == raw["grpo"]["num_prompts_per_step"]
    assert (val_dataloader is not None) == (raw["grpo"]["val_period"] > 0)


# The shipped configs whose rollout format needs NeMo-RL main (nemo_ais.preflight's table,
# read against both sources in test_rollout_format_support.py).
MAIN_ONLY = {
    "experiments/qwen3_8b_mxfp8_ais.yaml": "policy.generation.vllm_cfg.is_mx=true (MXFP8 rollout)",
    "experiments/qwen3_8b_nvfp4_w4a4_ais.yaml": (
        "policy.generation.real_quant=true with policy.generation.quant_cfg="
        "'examples/modelopt/quant_configs/nano3_nvfp4_default.yaml' (NVFP4 W4A4"
    ),
}


def test_every_config_runs_on_the_versions_its_rollout_format_needs():
    runs_on = {_rel(p): v for p, v in RUNS_ON.items()}
    assert {k for k, v in runs_on.items() if v == ("main",)} == set(MAIN_ONLY)
    assert all(v == ("v0.7.0", "main") for k, v in runs_on.items() if k not in MAIN_ONLY)
    assert "experiments/qwen3_8b_nvfp4_w4a16_ais.yaml" in runs_on  # W4A16 runs on both


def test_a_format_this_nemo_rl_lacks_is_refused_before_ray(real_setup):
    """v0.7.0 would roll out W4A16 for the W4A4 recipe and block FP8 for is_mx: main()
    refuses both before Ray, naming the switch and the version; main runs them (above)."""
    refused = sorted(_rel(p) for p in FULL_CONFIGS if NEMO_RL not in RUNS_ON[p])
    assert refused == per_version(v0_7_0=sorted(MAIN_ONLY), main=[])
    for rel in refused:
        with pytest.raises(ValueError) as err:
            _main(real_setup, CONFIG_DIR / rel)
        assert f"{MAIN_ONLY[rel]}" in str(err.value)
        assert "needs NeMo-RL main; NeMo-RL v0.7.0 lacks it" in str(err.value)
        assert real_setup.driver.names() == [] and real_setup.setup_calls == []


def test_upstreams_fp8_guard_runs_without_the_view(real_setup, monkeypatch):
    """Without ``nemo_rl_view`` upstream's real FP8 assert stops setup(): the view is needed."""
    monkeypatch.setattr(run, "nemo_rl_view", lambda raw, ais_cfg: raw)
    with pytest.raises(AssertionError, match="Importance sampling must be enabled for vLLM FP8"):
        _main(real_setup, SMOKE)
    assert real_setup.factory_calls == []  # before any worker


def test_upstreams_fp8_kv_cache_pipeline_guard_runs(real_setup, monkeypatch):
    """Upstream's real KV-cache / PP assert (cluster_check's twin bypassed to reach it)."""
    monkeypatch.setattr(run, "fp8_kv_refit_problems", lambda raw: [])
    with pytest.raises(AssertionError, match="pipeline_model_parallel_size=1"):
        _main(real_setup, SMOKE, ["policy.megatron_cfg.pipeline_model_parallel_size=2"])


def test_fp8_kv_cache_with_vllms_async_engine_is_upstreams_setup_assert_and_the_offline_checks_failure(real_setup):
    """Upstream's "async rollouts" is vLLM's async_engine (not grpo.async_grpo): real setup() and the check agree."""
    override = ["policy.generation.vllm_cfg.async_engine=true"]
    failed = {r.name: r.detail for r in cc.check_config(cc.load_config(SMOKE, override)) if r.status == "fail"}
    assert "async rollouts (policy.generation.vllm_cfg.async_engine=true" in failed["fp8_rollout"]
    with pytest.raises(AssertionError, match="Async rollouts is not supported with kv cache fp8 enabled"):
        _main(real_setup, SMOKE, override)
    assert real_setup.factory_calls == []  # before any worker


@pytest.mark.parametrize(
    ("override", "check", "ours", "upstream"),
    [
        (
            (  # a whole DTensor section (MasterConfig's schema wants every key), Megatron still on
                "policy.dtensor_cfg.enabled=true",
                "+policy.dtensor_cfg.tensor_parallel_size=1",
                "+policy.dtensor_cfg.context_parallel_size=1",
                "+policy.dtensor_cfg.sequence_parallel=false",
                "+policy.dtensor_cfg.activation_checkpointing=false",
                "+policy.dtensor_cfg.cpu_offload=false",
                "policy.generation.vllm_cfg.kv_cache_dtype=auto",  # grpo.setup refuses DTensor with an FP8 one first
            ),
            "trainer_parallel",
            "policy.megatron_cfg.enabled and policy.dtensor_cfg.enabled are exclusive",
            (ValueError, r"Configure either Megatron .* not both"),
        ),
        (
            "policy.draft.enabled=true",
            "trainer_parallel",
            "policy.draft.enabled=true does not support policy.sequence_packing.enabled=true",
            (ValueError, "does not support sequence packing yet"),
        ),
        (
            "grpo.batch_multiplier=2",
            "batch",
            "grpo.batch_multiplier=2 needs grpo.use_dynamic_sampling=true",
            (AssertionError, "batch_multiplier>1 can only be used if use_dynamic_sampling=True"),
        ),
    ],
)
def test_what_upstreams_setup_or_policy_raises_after_ray_the_offline_check_fails(
    real_setup, override, check, ours, upstream
):
    """Each stops upstream's real setup() (Policy.__init__ or grpo.setup's asserts); the check names it offline."""
    overrides = list(override) if isinstance(override, tuple) else [override]
    failed = {r.name: r.detail for r in cc.check_config(cc.load_config(SMOKE, overrides)) if r.status == "fail"}
    assert ours in failed[check]
    error, match = upstream
    with pytest.raises(error, match=match):
        _main(real_setup, SMOKE, overrides)


def test_validation_sampling_of_its_own_is_mains_setup_assert_and_the_offline_checks_failure(real_setup):
    """Outside NeMo-Gym, main's real setup() stops on val_temperature != temperature; v0.7.0 ignores the key."""
    override = ["policy.generation.val_temperature=0.6"]
    failed = {r.name: r.detail for r in cc.check_config(cc.load_config(SMOKE, override)) if r.status == "fail"}
    assert "validation sampling that differs from training" in failed["vllm_parallel"]
    if NEMO_RL == "main":
        with pytest.raises(AssertionError, match="val_temperature/val_top_p/val_top_k differing"):
            _main(real_setup, SMOKE, override)
    else:
        _main(real_setup, SMOKE, override)  # v0.7.0's setup() runs to its return: validation samples at 1.0
        (call,) = real_setup.setup_calls
        assert "returned" in call and call["args"][0].model_dump()["policy"]["generation"]["val_temperature"] == 0.6


@pytest.mark.parametrize("serves_http", [True, False])
def test_the_nemo_gym_rule_is_upstreams_should_use_nemo_gym(serves_http):
    """cluster_check fails a NeMo-Gym config exactly when upstream's real should_use_nemo_gym asserts."""
    overrides = [
        "grpo.async_grpo.enabled=true",
        "policy.generation.vllm_cfg.kv_cache_dtype=auto",
        "policy.generation.vllm_cfg.async_engine=true",
        f"+policy.generation.vllm_cfg.expose_http_server={str(serves_http).lower()}",
        "+env.should_use_nemo_gym=true",
    ]
    raw = run.load_config_dict(str(SMOKE), overrides)
    ais_cfg = run.validate_ais(raw)
    master = ais_master_config(raw, run.nemo_rl_view(raw, ais_cfg), ais_cfg)
    if NEMO_RL == "main":
        from nemo_rl.environments.nemo_gym import should_use_nemo_gym
    else:
        should_use_nemo_gym = grpo._should_use_nemo_gym
    failed = {r.name: r.detail for r in cc.check_config(cc.load_config(SMOKE, overrides)) if r.status == "fail"}
    if serves_http:
        assert should_use_nemo_gym(master) is True and failed == {}
    else:
        with pytest.raises(AssertionError, match="expose_http_server"):
            should_use_nemo_gym(master)
        assert "vllm_cfg.expose_http_server=true (NeMo-RL's should_use_nemo_gym" in failed["vllm_parallel"]


# ----------------------------------------------------------- cluster_check.ENTRY_POINT_KEYS
#
# Each key is dropped (deleted from the loaded dict, so no interpolation breaks first) from
# the smoke config, with its feature flag switched on; then upstream's real code must stop
# on it -- a pydantic ``ValidationError`` from ``MasterConfig`` naming it (before Ray) or a
# ``KeyError`` raised inside NeMo-RL (after Ray started: the failure ENTRY_POINT_KEYS exists
# to catch offline) -- and cluster_check must report it offline.

NEMO_RL_DIR = Path(grpo.__file__).resolve().parents[2]
# flag -> overrides that switch its feature on (smoke config; cheap, no server starts: the
# logger backends' KeyError fires while their constructor's arguments are evaluated)
ENABLE = {
    "logger.wandb_enabled": ["logger.wandb_enabled=true"],
    "logger.swanlab_enabled": ["logger.swanlab_enabled=true"],
    "logger.tensorboard_enabled": ["logger.tensorboard_enabled=true"],
    "logger.mlflow_enabled": ["logger.mlflow_enabled=true"],
    "logger.monitor_gpus": ["logger.monitor_gpus=true"],
    "grpo.async_grpo.enabled": [
        "grpo.async_grpo.enabled=true",
        "policy.generation.vllm_cfg.kv_cache_dtype=auto",  # async needs a BF16 KV cache
    ],
    "policy.dynamic_batching.enabled": [
        "policy.dynamic_batching.enabled=true",
        "+policy.dynamic_batching.train_mb_tokens=512",
        "+policy.dynamic_batching.logprob_mb_tokens=512",
        "+policy.dynamic_batching.sequence_length_round=64",
        "policy.sequence_packing.enabled=false",
    ],
    "policy.sequence_packing.enabled": ["policy.sequence_packing.enabled=true"],
    "policy.draft.enabled": ["policy.draft.enabled=true", "policy.sequence_packing.enabled=false"],
}
# the launcher's own FP8-refit check reads it first; with it off, upstream's setup() does
KEY_OVERRIDES = {"policy.generation.vllm_cfg.precision": ["ais_fp8_refit.enabled=false"]}
# Read unguarded, but only after setup() returns (training, GPU): main() -> setup() passes
# without them; the upstream file that reads them holds the subscript.
READ_AFTER_SETUP = {
    "checkpointing.checkpoint_must_save_by": (
        "nemo_rl/algorithms/grpo.py",
        'master_config.checkpointing["checkpoint_must_save_by"]',
    ),
    "policy.draft.loss_weight": ("nemo_rl/models/megatron/train.py", '["draft"]["loss_weight"]'),
}


def _drop(raw: dict, key: str) -> dict:
    out = copy.deepcopy(raw)
    node = out
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    del node[leaf]
    return out


def _run_without(rec: _Run, monkeypatch, raw: dict) -> BaseException | None:
    monkeypatch.setattr(run, "load_config_dict", lambda path, overrides: copy.deepcopy(raw))
    rec.use_config(raw)
    del rec.driver.events[:]
    try:
        run.main(["--config", str(SMOKE)])
    except Exception as err:  # what upstream raised, judged by the caller
        return err
    return None


def _upstream_stopped_on(err: BaseException | None, key: str, rec: _Run) -> str:
    """``"schema"`` / ``"after_ray"`` if upstream's real code stopped on ``key``; else fail."""
    leaf = key.rsplit(".", 1)[-1]
    if isinstance(err, ValidationError):
        assert any(
            e["type"] == "missing" and e["loc"][-1] == leaf and e["loc"][0] == key.split(".")[0] for e in err.errors()
        ), err
        assert "init_ray" not in rec.driver.names()  # MasterConfig(...) runs before Ray
        return "schema"
    assert isinstance(err, KeyError) and err.args == (leaf,), repr(err)
    frame = traceback.extract_tb(err.__traceback__)[-1]
    assert Path(frame.filename).resolve().is_relative_to(NEMO_RL_DIR), frame
    assert rec.driver.names()[:1] == ["init_ray"]  # the costly case: Ray was already up
    return "after_ray"


def rec_trained(rec: _Run) -> int:
    return int("grpo_train" in rec.driver.names())


def _defaulted_by_upstream(key: str) -> bool:
    """True if upstream's GRPO schema gives ``key`` a default (main's pydantic GRPOConfig;
    v0.7.0's TypedDict has none): dropping it is then no error on this version."""
    section, *path = key.split(".")
    model = getattr(grpo, "GRPOConfig", None) if section == "grpo" else None
    for part in path:
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        field = fields[part]
        if part == path[-1]:
            return not field.is_required()
        # a nested section, possibly Optional: the pydantic model among the annotation's args
        candidates = (field.annotation, *typing.get_args(field.annotation))
        model = next((c for c in candidates if hasattr(c, "model_fields")), None)
    return False


def _entry_point_fails(cfg: dict) -> str:
    (result,) = [r for r in cc.check_config(cfg) if r.name == "entry_point_keys"]
    assert result.status == "fail"
    return result.detail


@pytest.mark.parametrize(
    ("key", "flag"), [(k, f) for k, _, f in cc.ENTRY_POINT_KEYS], ids=[k for k, _, _ in cc.ENTRY_POINT_KEYS]
)
def test_every_entry_point_key_is_read_by_upstream_and_checked_offline(real_setup, monkeypatch, key, flag):
    overrides = [*ENABLE.get(flag, []), *KEY_OVERRIDES.get(key, [])]
    full = run.load_config_dict(str(SMOKE), overrides)
    assert flag is None or cc.get(full, flag) is True
    raw = _drop(full, key)
    assert f"{key} is missing" in _entry_point_fails(raw)  # cluster_check, offline

    err = _run_without(real_setup, monkeypatch, raw)
    if _defaulted_by_upstream(key):  # main: grpo.* keys have schema defaults
        assert NEMO_RL == "main" and key.startswith("grpo."), key
        trained = {"grpo_train", "async_grpo_train"} & set(real_setup.driver.names())
        assert err is None and trained, repr(err)
        return
    if key in READ_AFTER_SETUP:
        assert err is None, repr(err)  # not on main() -> setup(): documented, not run here
        path, subscript = READ_AFTER_SETUP[key]
        assert subscript in (NEMO_RL_DIR / path).read_text()
        return
    _upstream_stopped_on(err, key, real_setup)


def _upstream_run_grpo(rec: _Run, monkeypatch, overrides: list[str]):
    """Upstream's own entry point, ``examples/run_grpo.py`` main(), on the smoke config."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_nemo_rl_examples_run_grpo", NEMO_RL_DIR / "examples" / "run_grpo.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rec.driver.install(monkeypatch, module)  # it imported the names at module level
    rec.use_config(run.load_config_dict(str(SMOKE), overrides))
    monkeypatch.setattr(sys, "argv", ["run_grpo.py", "--config", str(SMOKE), *overrides])
    module.main()


def test_upstreams_own_entry_point_runs_the_smoke_config_through_setup(real_setup, monkeypatch):
    """examples/run_grpo.py (no AIS) reaches grpo_train with our config through real setup().

    Upstream's FP8 guard needs its own IS flag on here (our launcher's view sets it).
    """
    _upstream_run_grpo(real_setup, monkeypatch, ["loss_fn.use_importance_sampling_correction=true"])
    assert real_setup.driver.names() == [
        "init_ray",
        "get_tokenizer",
        "setup_response_data",
        "grpo_train",
        *AFTER_TRAINING,
    ]
    (group,) = real_setup.actors.groups
    assert group["builder"].ray_actor_class_fqn.endswith("MegatronPolicyWorker")
    assert type(real_setup.driver.event("grpo_train")["args"][5]) is ClippedPGLossFn


def test_a_missing_draft_section_is_the_entry_points_key_error(real_setup, monkeypatch):
    """Issue 11 defect 1: no ``policy.draft`` at all -> KeyError('draft') after Ray started,
    in upstream's own entry point and in our launcher (same subscript); cluster_check
    reports it offline."""
    with pytest.raises(KeyError, match="draft") as upstream:
        _upstream_run_grpo(
            real_setup, monkeypatch, ["loss_fn.use_importance_sampling_correction=true", "~policy.draft"]
        )
    frame = traceback.extract_tb(upstream.value.__traceback__)[-1]
    assert Path(frame.filename).name == "run_grpo.py" and '["draft"]' in frame.line
    assert real_setup.driver.names() == ["init_ray", "get_tokenizer"]

    raw = _drop(run.load_config_dict(str(SMOKE), []), "policy.draft")
    assert "policy.draft.enabled is missing" in _entry_point_fails(raw)
    err = _run_without(real_setup, monkeypatch, raw)
    assert isinstance(err, KeyError) and err.args == ("draft",)
    frame = traceback.extract_tb(err.__traceback__)[-1]
    assert Path(frame.filename).name == "run_grpo_ais.py" and '["draft"]' in frame.line
    assert real_setup.driver.names() == ["init_ray", "get_tokenizer"]


def test_every_key_upstream_reads_unguarded_after_ray_starts_is_listed(real_setup, monkeypatch):
    """The other direction: ENTRY_POINT_KEYS misses no key of the smoke config that
    main() -> setup() reads unguarded past MasterConfig's schema (a KeyError after Ray)."""
    base = run.load_config_dict(str(SMOKE), [])
    listed = {k for k, _, _ in cc.ENTRY_POINT_KEYS}
    after_ray, trained = set(), 0
    for key in sorted(flat(base)):
        raw = _drop(base, key)
        try:
            grpo.MasterConfig(**run.nemo_rl_view(raw, run.validate_ais(raw)))
        except (ValidationError, ValueError, TypeError):
            continue  # refused before Ray, naming the key (schema or loss_fn.ais)
        err = _run_without(real_setup, monkeypatch, raw)
        if isinstance(err, KeyError):
            after_ray.add(key)
            _upstream_stopped_on(err, key, real_setup)
        elif err is not None:
            assert key in KEY_OVERRIDES, (key, repr(err))  # precision: our FP8-refit check
        else:
            trained += rec_trained(real_setup)
    # ~150 keys pass the schema; most are read guarded (or not at all) up to grpo_train
    assert trained > 100 and after_ray, (trained, after_ray)
    assert after_ray <= listed, sorted(after_ray - listed)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize(
    "override",
    [
        ("cluster.num_nodes=3", "cluster.gpus_per_node=2", "++env.reward_model.resources.num_nodes=1"),
        ("cluster.gpus_per_node=4", "++env.reward_model.resources.num_nodes=1"),
    ],
    ids=["a_reward_model_node", "reward_model_gpus_of_one_node"],
)
def test_the_policys_gpus_are_upstreams_setup_split_with_a_reward_model(real_setup, override):
    """grpo.setup keeps the reward model's nodes (one node: its GPUs) from the policy; gpu_split agrees."""
    overrides = [
        *override,
        "++env.reward_model.resources.gpus_per_node=1",
        "++data.default.env_name=reward_model",
        "grpo.num_prompts_per_step=4",  # divisible by the DP sizes of both splits
        "policy.train_global_batch_size=16",
    ]
    cfg = cc.load_config(SMOKE, overrides)
    assert not [r for r in cc.check_config(cfg) if r.status == "fail" and r.name in ("gpu_split", "trainer_parallel")]
    _main(real_setup, SMOKE, overrides)
    ((_, cluster_kwargs),) = real_setup.actors.clusters
    train, rollout = cc.gpu_split(cfg)
    assert sum(cluster_kwargs["bundle_ct_per_node_list"]) == train == rollout
    assert train == (4 if "cluster.num_nodes=3" in override else 3)  # 2 of 3 nodes x 2; 4 - 1 GPUs
    (policy,) = [c["returned"] for c in real_setup.factory_calls]
    assert policy.data_parallel_size == cc.parallel_layout(cfg).dp


@pytest.mark.parametrize("bypass", [False, True])
def test_the_tp4_batch_variant_check_is_upstreams_and_bypass_lifts_it(real_setup, bypass):
    """TP >= 4 with a logprob batch of its own: Policy's accuracy assert, unless force_on_policy_ratio (ais.bypass)."""
    overrides = [
        "cluster.gpus_per_node=4",
        "policy.megatron_cfg.tensor_model_parallel_size=4",
        "policy.logprob_batch_size=2",
        f"loss_fn.ais.bypass={str(bypass).lower()}",
    ]
    failed = {r.name: r.detail for r in cc.check_config(cc.load_config(SMOKE, overrides)) if r.status == "fail"}
    if bypass:
        assert "trainer_parallel" not in failed
        _main(real_setup, SMOKE, overrides)  # upstream's setup and Policy run to their return
        assert "returned" in real_setup.setup_calls[0]
    else:
        assert (
            "TP=4 >= 4 needs policy.train_micro_batch_size (4) == policy.logprob_batch_size (2)"
            in (failed["trainer_parallel"])
        )
        with pytest.raises(AssertionError, match="logprob_batch_size"):
            _main(real_setup, SMOKE, overrides)
