# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""GRPO with AIS on NeMo-RL: the entry point behind ``launchers/*.sh`` and ``ray.sub``.

Supports NeMo-RL v0.7.0 and main (:mod:`nemo_ais.nemo_rl.compat` names both, tells them
apart and refuses anything else before the config is read). Mirrors NeMo-RL's
``examples/run_grpo.py`` and changes four things:

1. ``loss_fn`` (with our ``loss_fn.ais`` section) is validated as
   :class:`~nemo_ais.nemo_rl.AISLossConfig` BEFORE Ray starts, so a bad config fails in
   seconds, naming ``loss_fn.ais.<field>``.
2. Every arm (``loss_fn.ais.mode: none`` included) hands ``setup()`` a ``policy_factory``
   that builds NeMo-RL's ``Policy`` with ``worker_extension_cls_fqn`` = our AIS worker for
   the configured backend (Megatron, DTensor v1/v2): it runs the per-global-batch prepare
   step (one all-reduce of the AIS statistics over the data-parallel group) before
   NeMo-RL's micro-batch loop. Upstream's TransferQueue path (``data_plane.enabled``:
   ``TQPolicy`` + ``grpo_train_sync``) is refused before Ray starts; the trainer is always
   ``grpo_train`` (or ``async_grpo_train``), as upstream's ``_select_trainer`` picks it
   with the data plane off.
3. ``setup()`` hard-codes ``ClippedPGLossFn``; the returned loss is replaced by
   :class:`~nemo_ais.nemo_rl.AISClippedPGLossFn` (:func:`swap_loss`), built with the
   flags ``setup()`` gave upstream's loss (main: ``use_fused_linear_logprobs``).
4. ``nemo_ais`` is put on ``PYTHONPATH`` so Ray workers (which inherit the driver's
   environment) can unpickle the loss and import the AIS workers; with an
   ``ais_fp8_refit`` section the vLLM workers also quantize the synced weights with
   :mod:`nemo_ais.fp8` (:func:`configure_fp8_refit`, :mod:`nemo_ais.nemo_rl.refit`); with an
   ``ais_nvfp4_refit`` section an NVFP4 engine loads the BF16 trainer's weights packed by
   :mod:`nemo_ais.refit.stream` (:func:`configure_block_refit`, same hook); and
   after ``setup()`` every vLLM worker is asked whether that is armed
   (:func:`require_fp8_refit_active`; the run stops naming the worker if not). The
   optional ``ais_kv_calibration.reduction`` picks the Megatron worker's FP8 KV
   calibration rule (:func:`configure_kv_calibration`; absent: NeMo-RL's).

NeMo-RL's FP8-rollout and async-GRPO guards assert
``loss_fn.use_importance_sampling_correction``. AIS *is* the importance-sampling
correction, and combining it with NeMo-RL's own one is a config error, so the config
handed to ``setup()`` (only) reports the flag as on when ``loss_fn.ais`` owns the
correction; the loss itself is built from the user's config (:func:`nemo_rl_view`). What
NeMo-RL logs (W&B, TensorBoard, MLflow hyperparameters) and writes into each checkpoint's
``config.yaml`` is the user's ``loss_fn`` plus a ``nemo_ais_run`` marker naming the loss
that ran and the keys the driver saw differently (:mod:`nemo_ais.nemo_rl.run_config`).

Refused before Ray starts, with the field named: ``data_plane.enabled``,
``grpo.val_at_start`` with an FP8 KV cache, (main) a ``policy.generation.refit_transport``
other than the default with an FP8 rollout or KV cache (:func:`refit_transport_problems`),
and a rollout format the detected NeMo-RL lacks (NVFP4 W4A4 and MXFP8 on v0.7.0) or a
real-quant NVFP4 rollout on another refit transport
(:func:`nemo_ais.preflight.rollout_format_problems`).

Usage (inside NeMo-RL's environment, e.g. ``uv run`` from a NeMo-RL checkout)::

    python launchers/run_grpo_ais.py --config configs/nemo_rl/<config>.yaml loss_fn.ais.mode=ais
"""

from __future__ import annotations

import argparse
import copy
import os
import pprint
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from nemo_ais.nemo_rl import NEMO_RL_INSTALL_HINT, compat  # noqa: E402
from nemo_ais.nemo_rl.policy_factory import (  # noqa: E402
    ais_worker_fqn,
    make_policy_factory,
    register_ais_workers,
)
from nemo_ais.preflight import (  # noqa: E402
    bypass_problems,
    fp8_kv_refit_problems,
    rollout_format_problems,
)
from nemo_ais.preflight.checks.formats import kept_in_bf16, rollout_format  # noqa: E402
from nemo_ais.preflight.loader import get  # noqa: E402
from nemo_ais.preflight.model_shapes import resolve_model_shape  # noqa: E402
from nemo_ais.rules.native_kernels import NATIVE_KERNELS  # noqa: E402

__all__ = [
    "ConfigError",
    "ais_worker_fqn",
    "check_engines_after_first_refit",
    "configure_block_refit",
    "configure_fp8_refit",
    "configure_kv_calibration",
    "engine_keep_rule",
    "ensure_worker_pythonpath",
    "load_config_dict",
    "main",
    "make_policy_factory",
    "nemo_rl_view",
    "parse_args",
    "refit_transport_problems",
    "register_ais_workers",
    "require_fp8_refit_active",
    "require_native_cluster",
    "require_native_kernels",
    "swap_loss",
    "validate_ais",
]

_ASYNC_UNSUPPORTED = ("use_dynamic_sampling", "reward_scaling", "reward_shaping")


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """``--config PATH`` plus Hydra-style overrides (``a.b=1``, ``+new.key=2``)."""
    parser = argparse.ArgumentParser(
        description="GRPO + AIS on NeMo-RL (v0.7.0 or main)",
        epilog="Overrides follow --config as in NeMo-RL's run_grpo.py: key=value, "
        "+new.key=value, ~key (Hydra's grammar). docs/migration.md, docs/cluster.md.",
    )
    parser.add_argument("--config", required=True, help="NeMo-RL GRPO YAML (defaults: allowed)")
    return parser.parse_known_args(argv)


class ConfigError(ValueError):
    """A config ``main`` refuses before Ray starts (``python run_grpo_ais.py``: one line)."""

    @classmethod
    def of(cls, err: Exception) -> ConfigError:
        """``err``'s message on one line (its type's name if it has none)."""
        return cls(" ".join(str(err).split()) or type(err).__name__)


def load_config_dict(config_path: str, overrides: Sequence[str]) -> dict[str, Any]:
    """NeMo-RL's loader: ``defaults:`` inheritance, Hydra overrides, resolved to a dict."""
    from nemo_rl.utils.config import load_config, parse_hydra_overrides
    from omegaconf import OmegaConf

    config = load_config(config_path)
    if overrides:
        config = parse_hydra_overrides(config, list(overrides))
    return OmegaConf.to_container(config, resolve=True)


def validate_ais(config: dict[str, Any]) -> Any:
    """``config["loss_fn"]`` as an :class:`AISLossConfig` (raises ``ValueError``)."""
    from nemo_ais.nemo_rl import validate_loss_config

    return validate_loss_config(config.get("loss_fn") or {})


def nemo_rl_view(config: dict[str, Any], ais_cfg: Any) -> dict[str, Any]:
    """The config handed to NeMo-RL's ``setup()``.

    NeMo-RL asserts ``loss_fn.use_importance_sampling_correction`` for FP8 rollouts and
    async GRPO. When ``loss_fn.ais`` owns the correction -- AIS on, or an explicit
    ``loss_fn.ais.mode: none`` (the uncorrected FP8 arm of the evaluation protocol) -- the
    flag reads True in this view only. The ``ClippedPGLossFn`` that ``setup()`` builds
    from it is discarded by :func:`swap_loss`; the loss that trains is built from the
    user's config.

    ``loss_fn.ais.bypass`` (pi_old := mu, the rollout's log-probs): the view also sets
    NeMo-RL's ``loss_fn.force_on_policy_ratio``, so ``grpo_train`` skips the trainer's
    ``prev_logprobs`` forward (upstream's ``opd._skip_prev_logprobs``: it fills zeros) and
    ``setup()`` asserts its own precondition, one update per rollout batch
    (``train_global_batch_size == num_prompts_per_step * num_generations_per_prompt``).
    The AIS loss never reads those zeros: with ``bypass`` it takes ``generation_logprobs``
    as pi_old (:mod:`nemo_ais.core`).
    """
    loss_cfg = config.get("loss_fn") or {}
    owns_correction = ais_cfg.ais.mode != "none" or (
        "ais" in loss_cfg and not loss_cfg.get("use_importance_sampling_correction", False)
    )
    if not owns_correction:
        return config
    view = copy.deepcopy(config)
    view["loss_fn"]["use_importance_sampling_correction"] = True
    if ais_cfg.ais.bypass:
        view["loss_fn"]["force_on_policy_ratio"] = True  # skip the prev_logprobs forward
    return view


def swap_loss(loss_fn: Any, ais_cfg: Any) -> Any:
    """Replace the ``ClippedPGLossFn`` returned by ``setup()`` with the AIS loss.

    The AIS loss gets the constructor flags ``setup()`` gave upstream's loss
    (:func:`nemo_ais.nemo_rl.compat.loss_init_kwargs`; main: ``use_fused_linear_logprobs``).

    Raises:
        TypeError: ``setup()`` returned something else (a NeMo-RL change to re-check).
    """
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn

    from nemo_ais.nemo_rl import AISClippedPGLossFn

    if type(loss_fn) is not ClippedPGLossFn:
        raise TypeError(
            f"grpo.setup() returned {type(loss_fn).__name__}, expected ClippedPGLossFn "
            "(NeMo-RL v0.7.0 and main); the AIS loss swap must be re-checked for this version"
        )
    return AISClippedPGLossFn(ais_cfg, **compat.loss_init_kwargs(loss_fn))


def ensure_worker_pythonpath(environ: dict[str, str] | None = None) -> str:
    """Prepend this checkout to ``PYTHONPATH`` (Ray workers inherit the driver's env)."""
    environ = os.environ if environ is None else environ
    parts = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in parts:
        parts.insert(0, str(REPO_ROOT))
    environ["PYTHONPATH"] = os.pathsep.join(parts)
    return environ["PYTHONPATH"]


def configure_fp8_refit(config: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    """Arm the AIS refit of an FP8 engine in the vLLM workers (``ais_fp8_refit``).

    :func:`nemo_ais.nemo_rl.refit.configure`: validates the section's
    :class:`~nemo_ais.fp8.Fp8SyncConfig` with defaults from ``policy.generation.vllm_cfg``
    (``tp_size``, ``ue8m0`` = ``pow2_weight_scaling_factors``, ``num_first/last_layers_in_bf16``),
    sets ``NEMO_AIS_REFIT`` and puts ``nemo_ais/nemo_rl/_vllm_hook`` (its ``sitecustomize``)
    first on ``PYTHONPATH``. Returns the config, or None when the section is absent or
    ``enabled: false`` (NeMo-RL's own FP8 refit).
    """
    from nemo_ais.nemo_rl import refit

    return refit.configure(config, environ, section="ais_fp8_refit")


def configure_block_refit(config: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    """Arm the NVFP4 refit of a BF16 trainer in the vLLM workers (``ais_nvfp4_refit``).

    :func:`nemo_ais.nemo_rl.refit.configure`, the same hook as :func:`configure_fp8_refit`.
    Returns the validated :class:`~nemo_ais.fp8.BlockSyncConfig`, or None when the section
    is absent or disabled (NeMo-RL's NVFP4 engine then cannot load a BF16 refit).
    """
    from nemo_ais.nemo_rl import refit

    return refit.configure(config, environ, section="ais_nvfp4_refit")


def configure_kv_calibration(config: dict[str, Any], environ: dict[str, str] | None = None) -> str:
    """The Megatron worker's FP8 KV calibration rule, from ``ais_kv_calibration.reduction``.

    Absent section or key: ``percentile_of_amax`` (NeMo-RL's own rule, the same scales as
    upstream's ``calibrate_qkv_fp8_scales``); ``element_percentile``: the percentile of
    ``|x|`` over each micro-batch's elements (:mod:`nemo_ais.refit.kv_scales`). Sets
    ``NEMO_AIS_KV_REDUCTION`` (the policy workers inherit the environment).

    Raises:
        ValueError: naming ``ais_kv_calibration`` / ``ais_kv_calibration.reduction``.
    """
    from nemo_ais.megatron.kv_calibration import KV_REDUCTION_ENV
    from nemo_ais.refit.config import kv_calibration_reduction

    reduction = kv_calibration_reduction(config)  # the offline check reads the section the same way
    (os.environ if environ is None else environ)[KV_REDUCTION_ENV] = reduction
    return reduction


def _async_engine(config: Any) -> bool:
    return bool((config.policy["generation"].get("vllm_cfg") or {}).get("async_engine", False))


def require_fp8_refit_active(config: Any, policy_generation: Any) -> None:
    """After ``setup()``: ask every vLLM worker process whether the AIS FP8 refit is armed.

    :func:`nemo_ais.nemo_rl.refit.require_active`; raises ``RuntimeError`` naming each
    worker where it is not. ``config`` (NeMo-RL's master config) is not read: every engine
    kind is asked. With ``vllm_cfg.async_engine`` (vLLM's ``AsyncLLM``) the
    workers are asked on the engine's event loop
    (:func:`nemo_ais.nemo_rl.engine_report.engine_rpc`); an engine whose loop cannot be
    found is left unasked, with a WARNING naming it (a dead engine, or one that does not
    answer in ``engine_report.RPC_TIMEOUT_S``, stops the run).
    """
    from nemo_ais.nemo_rl import refit as ais_refit
    from nemo_ais.nemo_rl.engine_report import AsyncEngineUnreachable

    try:
        ais_refit.require_active(policy_generation)
    except AsyncEngineUnreachable as err:
        ais_refit.logger.warning(
            "nemo_ais: these vLLM workers are not asked whether the AIS refit is armed (their "
            "import hook still is): %s",
            err,
        )


def require_native_cluster(raw: dict[str, Any]) -> str:
    """After ``init_ray()``, before ``setup()``: stop if no GPU of the cluster runs the format.

    :func:`nemo_ais.nemo_rl.engine_report.require_native_nodes`: every Ray node reads its
    GPUs by NVML (no GPU reserved, no CUDA context), so a W4A4 or MXFP8 run on an all-Hopper
    cluster stops in seconds, naming the format and each node's GPUs and compute capability,
    before any engine loads a model. Returns the config's rollout format.
    """
    from nemo_ais.nemo_rl import engine_report

    fmt = rollout_format(raw)
    engine_report.require_native_nodes(fmt)
    return fmt


def require_native_kernels(config: Any, raw: dict[str, Any], policy_generation: Any) -> str:
    """After ``setup()``: stop if the engines' GPUs cannot run the rollout format as named.

    vLLM only logs a kernel fallback (W4A4 on Hopper runs W4A16, :mod:`nemo_ais.rules.
    native_kernels`); :func:`nemo_ais.nemo_rl.engine_report.require_native_gpu` asks every
    vLLM worker process for its GPU (with ``vllm_cfg.async_engine``: every generation actor,
    by NVML) and raises naming the format, each GPU and its compute capability.

    Returns:
        The config's rollout format (``nemo_ais.preflight.rollout_format``).
    """
    from nemo_ais.nemo_rl import engine_report

    fmt = rollout_format(raw)
    if fmt not in NATIVE_KERNELS:
        return fmt
    engine_report.require_native_gpu(policy_generation, fmt, async_engine=_async_engine(config))
    return fmt


def engine_keep_rule(raw: dict[str, Any], refit_cfg: Any) -> Any:
    """The keep-in-BF16 rule the engines must match: the AIS refit's, else NeMo-RL's."""
    if refit_cfg is not None:
        return refit_cfg.keep_rule().keeps
    shape = resolve_model_shape(str(get(raw, "policy.model_name", ""))).shape
    return kept_in_bf16(raw, shape.num_layers if shape is not None else 0)


def check_engines_after_first_refit(
    grpo_module: Any, raw: dict[str, Any], policy_generation: Any, refit_cfg: Any, nemo_rl_version: str
) -> None:
    """After the first refit, every layer of every engine must hold what the run quantizes.

    Wraps ``grpo_module.refit_policy_generation`` (both NeMo-RL versions' ``grpo_train``
    look it up there at each call): the first call refits, then
    :func:`nemo_ais.nemo_rl.engine_report.require_engine_formats` compares each vLLM
    layer's quant method and kernel with the run's keep-in-BF16 rule
    (:func:`engine_keep_rule`) and raises naming every layer that differs, before the first
    rollout trains anything; later calls only refit. With ``vllm_cfg.async_engine`` (vLLM's
    ``AsyncLLM``) the layers are read on the engine's event loop
    (:func:`nemo_ais.nemo_rl.engine_report.engine_rpc`); an engine whose loop cannot be
    found is left unread, with a WARNING naming it, after the others were compared (a dead
    engine, or one that does not answer in ``engine_report.RPC_TIMEOUT_S``, stops the run).
    """
    from nemo_ais.nemo_rl import engine_report

    fmt = rollout_format(raw)
    if fmt not in NATIVE_KERNELS:
        return
    real = grpo_module.refit_policy_generation
    rule = engine_keep_rule(raw, refit_cfg)
    checked = False

    def refit_then_check(*args: Any, **kwargs: Any) -> Any:
        nonlocal checked
        out = real(*args, **kwargs)
        if not checked:
            checked = True
            try:
                reports = engine_report.require_engine_formats(
                    policy_generation, fmt, rule, nemo_rl_version=nemo_rl_version
                )
            except engine_report.AsyncEngineUnreachable as err:
                engine_report.logger.warning(
                    "nemo_ais: these engines' layer formats are not read after the first refit "
                    "(their GPUs were checked; the others hold %s as the run quantizes it): %s",
                    fmt,
                    err,
                )
                return out
            engine_report.logger.warning(
                "nemo_ais: after the first refit %d vLLM worker processes hold %s as the run quantizes it",
                len(reports),
                fmt,
            )
        return out

    refit_then_check.__wrapped__ = real  # type: ignore[attr-defined]
    grpo_module.refit_policy_generation = refit_then_check


def refit_transport_problems(config: dict[str, Any]) -> list[str]:
    """``policy.generation.refit_transport`` (main) other than the default, with FP8 rollouts.

    The AIS FP8 refit (``fp8.load_weights`` in the vLLM worker) and the KV-scale guard (the
    Megatron worker's ``stream_weights_via_ipc_zmq`` / ``broadcast_weights_for_collective``)
    sit on the default transport (null: CUDA IPC colocated, NCCL otherwise); main's
    ``nccl_reshard``, NIXL / checkpoint-engine and sparse transports bypass both.
    """
    transport = get(config, "policy.generation.refit_transport")
    vllm_cfg = get(config, "policy.generation.vllm_cfg", {})
    fp8 = vllm_cfg.get("precision") == "fp8" or str(vllm_cfg.get("kv_cache_dtype")).startswith("fp8")
    if transport is None or not fp8:
        return []
    return [
        f"policy.generation.refit_transport={transport!r} is not supported with an FP8 rollout "
        "or FP8 KV cache: the AIS FP8 refit and the KV-scale guard run on the default "
        "transport only; set policy.generation.refit_transport: null"
    ]


def _check_async(config: dict[str, Any]) -> None:
    grpo = config["grpo"]
    for feature in _ASYNC_UNSUPPORTED:
        value = grpo.get(feature)
        on = value.get("enabled", False) if isinstance(value, dict) else bool(value)
        if on:
            raise NotImplementedError(f"grpo.{feature} is not supported with async GRPO")
    if config["data"].get("use_multiple_dataloader", False):
        raise NotImplementedError("data.use_multiple_dataloader is not supported with async GRPO")


def main(argv: Sequence[str] | None = None) -> None:
    """Load + validate the config, start Ray, ``setup()``, swap the loss, train.

    Raises ``ConfigError`` (a ``ValueError``) for a config refused before Ray starts.
    """
    args, overrides = parse_args(argv)  # --help: before NeMo-RL is imported
    try:
        from nemo_rl.algorithms import grpo
    except ImportError as err:
        raise ImportError(NEMO_RL_INSTALL_HINT) from err
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.data.utils import setup_response_data
    from nemo_rl.distributed.virtual_cluster import init_ray
    from nemo_rl.models.generation import configure_generation_config
    from nemo_rl.utils.config import OverridesError, register_omegaconf_resolvers
    from nemo_rl.utils.logger import get_next_experiment_dir
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    from nemo_ais.nemo_rl.run_config import ais_master_config

    version = compat.require_supported()  # names the supported versions otherwise
    print(f"NeMo-RL: {compat.SUPPORTED[version.name]} at {version.location}")
    register_omegaconf_resolvers()
    try:  # before Ray: config errors surface in seconds
        raw = load_config_dict(args.config, overrides)
        ais_cfg = validate_ais(raw)
        problems = fp8_kv_refit_problems(raw) + refit_transport_problems(raw)
        problems += rollout_format_problems(raw, version.name)  # NVFP4 W4A4 / MXFP8: main only
        problems += bypass_problems(raw)  # one update per rollout batch
    except (OSError, TypeError, ValueError, OverridesError, YAMLError, OmegaConfBaseException) as err:
        raise ConfigError.of(err) from err
    if problems:
        raise ConfigError("; ".join(problems))
    try:  # the refit and KV sections, before the experiment directory exists
        kv_reduction = configure_kv_calibration(raw)
        ensure_worker_pythonpath()
        refit = configure_fp8_refit(raw)  # the workers inherit the environment
        block_refit = configure_block_refit(raw)  # NVFP4 engine, BF16 trainer: same hook
    except (TypeError, ValueError) as err:
        raise ConfigError.of(err) from err
    print(f"ais_kv_calibration.reduction: {kv_reduction}")
    print(f"loss_fn.ais: {ais_cfg.ais.model_dump()}")
    # Upstream picks the policy factory in the launcher too (TQPolicy when data_plane.enabled,
    # then _select_trainer -> grpo_train_sync). Every arm here trains on the AIS worker, which
    # is composed with Policy only; TQ's trainer also refits and recalibrates KV scales on its
    # own path. So data_plane.enabled is refused, for every mode, before Ray starts.
    policy_factory = make_policy_factory(raw)
    view = nemo_rl_view(raw, ais_cfg)
    if ais_cfg.ais.mode == "none" and view is not raw:
        print(
            "WARNING: loss_fn.ais.mode=none: training WITHOUT importance-sampling correction "
            "(the uncorrected arm); NeMo-RL's FP8/async guards are bypassed on purpose"
        )
    # the driver reads the view; the loggers and every checkpoint's config.yaml get the
    # user's loss_fn and a marker of the loss that ran (nemo_ais.nemo_rl.run_config)
    config = ais_master_config(raw, view, ais_cfg)
    pprint.pprint(config)
    config.logger["log_dir"] = get_next_experiment_dir(config.logger["log_dir"])

    print(f"ais_fp8_refit: {refit.model_dump() if refit else 'off (NeMo-RL quantizer)'}")
    if block_refit is not None:
        print(f"ais_nvfp4_refit: {block_refit.model_dump()}")
    init_ray()
    require_native_cluster(raw)  # W4A4 / MXFP8 on GPUs without their kernels: stop here
    tokenizer = get_tokenizer(config.policy["tokenizer"])
    if config.policy["generation"] is None:  # upstream asserts it here
        raise ValueError("policy.generation is null: GRPO needs a generation config (vllm_cfg)")
    megatron_cfg = config.policy.get("megatron_cfg") or {}
    config.policy["generation"] = configure_generation_config(
        config.policy["generation"],
        tokenizer,
        has_refit_draft_weights=bool(config.policy["draft"]["enabled"]),
        trains_mtp=bool(megatron_cfg.get("mtp_num_layers")),
    )
    dataset, val_dataset, task_to_env, val_task_to_env = setup_response_data(tokenizer, config.data, config.env)
    (
        policy,
        policy_generation,
        _nemo_gym,
        _clusters,
        dataloader,
        val_dataloader,
        loss_fn,
        logger,
        checkpointer,
        grpo_state,
        master_config,
        teacher_worker_groups,
        alias_to_group_alias,
    ) = grpo.setup(config, tokenizer, dataset, val_dataset, policy_factory=policy_factory)
    if refit is not None or block_refit is not None:  # every vLLM worker refits through
        require_fp8_refit_active(config, policy_generation)  # nemo_ais.fp8, or stop here
    if require_native_kernels(config, raw, policy_generation) in NATIVE_KERNELS:
        check_engines_after_first_refit(grpo, raw, policy_generation, refit or block_refit, version.name)
    loss_fn = swap_loss(loss_fn, ais_cfg)

    async_cfg = compat.grpo_option(config, "async_grpo") or {}
    try:
        with compat.training_context(checkpointer):  # main: flushes background saves
            if async_cfg.get("enabled", False):
                _check_async(raw)
                grpo.async_grpo_train(
                    policy=policy,
                    policy_generation=policy_generation,
                    dataloader=dataloader,
                    val_dataloader=val_dataloader,
                    tokenizer=tokenizer,
                    loss_fn=loss_fn,
                    task_to_env=task_to_env,
                    val_task_to_env=val_task_to_env,
                    logger=logger,
                    checkpointer=checkpointer,
                    grpo_save_state=grpo_state,
                    master_config=master_config,
                    max_trajectory_age_steps=async_cfg["max_trajectory_age_steps"],
                    teacher_worker_groups=teacher_worker_groups,
                    alias_to_group_alias=alias_to_group_alias,
                )
            else:
                grpo.grpo_train(
                    policy,
                    policy_generation,
                    dataloader,
                    val_dataloader,
                    tokenizer,
                    loss_fn,
                    task_to_env,
                    val_task_to_env,
                    logger,
                    checkpointer,
                    grpo_state,
                    master_config,
                )
    finally:  # main's run_grpo.py stops the environments and the engines here
        compat.shutdown_after_training(task_to_env, val_task_to_env, policy_generation)


if __name__ == "__main__":
    try:
        main()
    except ConfigError as err:  # refused before Ray: the message, not a traceback
        print(f"run_grpo_ais.py: invalid config: {err}", file=sys.stderr)
        sys.exit(2)
