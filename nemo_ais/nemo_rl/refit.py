# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The vLLM refit patch: a BF16 trainer's weights quantized in the vLLM worker, any format.

It wraps NeMo-RL's ``...vllm.quantization.fp8.load_weights`` in each vLLM worker process after checking the recorded
signatures (v0.7.0 and main); the pair loop is :mod:`~nemo_ais.nemo_rl.vllm_refit`'s, and what differs between vLLM
method families is one row of :data:`ENGINES`. The launcher calls :func:`configure` (sets :data:`ENV_VAR`, puts
:data:`HOOK_DIR` first on ``PYTHONPATH``); each worker's ``_vllm_hook/sitecustomize.py`` arms the hook, and the driver
checks every vLLM worker process with :func:`require_active`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import torch
from pydantic import Discriminator, Tag, TypeAdapter

from nemo_ais.config import require_config
from nemo_ais.formats.registry import get_format
from nemo_ais.nemo_rl import compat, vllm_refit
from nemo_ais.nemo_rl.engine_report import ask_engines, engine_rpc, mro_names, raise_engine_problems
from nemo_ais.nemo_rl.vllm_refit import PATCHED, RECORDED_SIGNATURES, TARGET_MODULE, engine_pairs, unchanged
from nemo_ais.refit.config import SECTIONS as SECTIONS, read_input_amax_file, section_config
from nemo_ais.refit.stream import BlockSyncConfig, Fp8SyncConfig, RefitConfig, RefitStream
from nemo_ais.rules.config_keys import get
from nemo_ais.rules.format_geometry import fp8_refit_block_problem, fp8_refit_precision_problem
from nemo_ais.rules.native_kernels import NATIVE_KERNELS

logger = logging.getLogger(__name__)

ENV_VAR = "NEMO_AIS_REFIT"
"""The JSON of the :class:`~nemo_ais.refit.config.RefitConfig` the vLLM workers refit with."""
HOOK_DIR = Path(__file__).resolve().parent / "_vllm_hook"  # its sitecustomize arms the hook
# vLLM's ModelOpt NVFP4 classes, matched by name in the MRO (no vLLM import)
NVFP4_QUANT_CONFIG = "ModelOptNvFp4Config"
NVFP4_METHODS = frozenset({"ModelOptNvFp4LinearMethod", "ModelOptNvFp4FusedMoE"})
_GROUPED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def engine_is_nvfp4(vllm_config: Any) -> bool:
    """True when vLLM's quant config is ModelOpt NVFP4 (W4A4 or W4A16, any subclass)."""
    return NVFP4_QUANT_CONFIG in mro_names(getattr(vllm_config, "quant_config", None))


def holds_nvfp4(upstream: Any, model: Any, name: str) -> bool:
    """True when the engine holds ``name`` in NVFP4 (ValueError: a grouped NVFP4 expert slab)."""
    grouped = name.endswith(_GROUPED_EXPERTS)
    if not name.endswith(".weight") and not grouped:
        return False
    layer = upstream._get_module_from_param_name(model, name)
    nvfp4 = not NVFP4_METHODS.isdisjoint(mro_names(getattr(layer, "quant_method", None)))
    if grouped and nvfp4:
        raise ValueError(
            f"{name}: a grouped expert slab of NVFP4 experts; the NVFP4 refit quantizes "
            "per-expert weights (...mlp.experts.<e>.gate_proj.weight), export those"
        )
    return nvfp4 and not grouped


def _fp8_engine(upstream: Any, model_runner: Any, config: RefitConfig) -> bool:
    return not compat.upstream_quantizes_mx(upstream)  # MXFP8: upstream's quantizer, unchanged


def _mxfp8_engine(upstream: Any, model_runner: Any, config: RefitConfig) -> bool:
    if not compat.upstream_quantizes_mx(upstream):
        raise RuntimeError(
            f"{ENV_VAR}: format=mxfp8 but NeMo-RL's FP8 config is not MXFP8 (needs "
            "policy.generation.vllm_cfg.precision: fp8 and is_mx: true, NeMo-RL main)"
        )
    return True


def _nvfp4_engine(upstream: Any, model_runner: Any, config: RefitConfig) -> bool:
    vllm_config = getattr(model_runner, "vllm_config", None)
    if vllm_config is not None and not engine_is_nvfp4(vllm_config):
        found = type(getattr(vllm_config, "quant_config", None)).__name__
        raise RuntimeError(
            f"{ENV_VAR}: format={config.format} but the vLLM engine's quant config is "
            f"{found}, expected a {NVFP4_QUANT_CONFIG} (a ModelOpt NVFP4 engine)"
        )
    return True


def _holds_fp8(upstream: Any, model: Any, name: str) -> bool:
    return upstream._is_fp8_weight(name, model=model)


@dataclass(frozen=True)
class Engine:
    """What the patch needs to know about one vLLM method family (``fp8``, ``nvfp4``, ``mxfp8``)."""

    holds: Callable[[Any, Any, str], bool]  # (upstream, model, name) -> quantized?
    ours: Callable[..., bool]  # (upstream, model_runner, config) -> refit with ours (or raise)
    upstream_passthrough: bool = True  # tensors kept in BF16 go through upstream's load_weights
    wraps_is_fp8_model: bool = False  # also wrap is_fp8_model (NeMo-RL does not call it FP8)
    decides_backend: bool = False  # backend auto -> TE or torch once per process (block FP8)
    defaults: tuple[tuple[str, Any], ...] = ()  # config fields left None -> the hook's value
    signatures: tuple[str, ...] = ("load_weights", "_is_fp8_weight", "is_fp8_model", "_get_module_from_param_name")


ENGINES = {
    "fp8": Engine(_holds_fp8, _fp8_engine, decides_backend=True, signatures=("load_weights", "_is_fp8_weight")),
    "mxfp8": Engine(_holds_fp8, _mxfp8_engine, defaults=(("mxfp8_scale_name", "weight_scale_from_checkpoint"),)),
    "nvfp4": Engine(holds_nvfp4, _nvfp4_engine, upstream_passthrough=False, wraps_is_fp8_model=True),
}
"""The engine side of each vLLM method family (``NATIVE_KERNELS[format].family``)."""


def _engine(config: RefitConfig) -> Engine:
    return ENGINES[NATIVE_KERNELS[config.format].family]


def check_signatures(module: Any, names: Iterable[str] = ("load_weights", "_is_fp8_weight")) -> None:
    """Raise ``RuntimeError`` if an upstream function differs from :data:`RECORDED_SIGNATURES`."""
    fix = (
        "(NeMo-RL v0.7.0 and main). Re-check nemo_ais/nemo_rl/refit.py against this NeMo-RL "
        f"version or unset {ENV_VAR}."
    )
    vllm_refit.check_signatures(module, names, RECORDED_SIGNATURES, fix)


def refit_pairs(
    weights: Iterable[tuple[str, torch.Tensor]],
    holds: Callable[[str], bool],
    config: RefitConfig,
    passthrough: Callable[[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]] = unchanged,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` -> vLLM ``load_weights`` pairs (:func:`engine_pairs` on a new stream)."""
    return engine_pairs(weights, holds, RefitStream(config), passthrough)


def decide_backend(config: RefitConfig) -> RefitConfig:
    """``backend: auto`` decided once per process (``te`` or ``torch``), not once per tensor."""
    if config.backend != "auto" or not _engine(config).decides_backend:
        return config
    from nemo_ais.formats import te_backend

    device = "cuda" if torch.cuda.is_available() else "cpu"
    probe = torch.empty(0, device=device)
    te = te_backend.use_te(probe, "auto", family=config.family, block=config.block)
    return config.model_copy(update={"backend": "te" if te else "torch"})


def _input_amax(config: RefitConfig) -> dict[str, float] | None:
    if not get_format(config.format).static_input_amax:
        return None
    if config.input_amax_file is None:
        raise ValueError(
            f"{ENV_VAR}: format nvfp4_w4a4 needs input_amax_file (JSON {{module or fused group: "
            "calibrated input amax}}): the refit streams input_scale = amax / (6 * 448)"
        )
    return read_input_amax_file(config.input_amax_file)


def _hook_config(config: RefitConfig) -> RefitConfig:
    """The backend decided, and fields left None set as the engine's hook needs them."""
    update = {k: v for k, v in _engine(config).defaults if getattr(config, k) is None}
    return decide_backend(config.model_copy(update=update) if update else config)


def engine_head_dim(model_runner: Any) -> int | None:
    """The engine's attention head dim (vLLM's ``ModelConfig.get_head_size()``); None if the runner has none."""
    get_head_size = getattr(getattr(model_runner, "model_config", None), "get_head_size", None)
    return int(get_head_size()) if callable(get_head_size) else None


def install(module: Any, config: RefitConfig) -> bool:
    """Wrap ``module.load_weights`` (and what :data:`ENGINES` says); False if already patched.

    Raises:
        RuntimeError: the upstream signatures differ from the recorded ones.
        ValueError: W4A4 without ``input_amax_file``. TypeError: not a ``RefitConfig``.
    """
    require_config(config, RefitConfig, "install(config)")
    if getattr(module.load_weights, PATCHED, False):
        return False
    engine = _engine(config)
    try:
        check_signatures(module, engine.signatures)
        config = _hook_config(config)  # once per process, not once per tensor
        stream = RefitStream(config, _input_amax(config))
    except (RuntimeError, ValueError) as err:
        logger.warning("nemo_ais: AIS %s refit NOT installed in pid %d: %s", config.format, os.getpid(), err)
        raise
    original_load = module.load_weights
    held: dict[tuple[int, str], bool] = {}  # as upstream caches _is_fp8_weight

    def load_weights(weights, model_runner):
        nonlocal stream
        if not engine.ours(module, model_runner, config):
            return original_load(weights, model_runner)
        if stream.config.head_dim is None and (head_dim := engine_head_dim(model_runner)) is not None:
            stream = RefitStream(stream.config.model_copy(update={"head_dim": head_dim}), stream.input_amax)
        model = model_runner.model

        def holds(name: str) -> bool:
            key = (id(model), name)
            if key not in held:
                held[key] = engine.holds(module, model, name)
            return held[key]

        passthrough = vllm_refit.upstream_pairs(original_load, model) if engine.upstream_passthrough else unchanged
        try:
            model.load_weights(engine_pairs(weights, holds, stream, passthrough))
        except BaseException:
            stream.reset()  # held shards may point into the transport's reused buffers
            raise

    vllm_refit.patch(module, "load_weights", load_weights)
    if engine.wraps_is_fp8_model:
        original_is_fp8_model = module.is_fp8_model

        def is_fp8_model(vllm_config):
            return engine_is_nvfp4(vllm_config) or original_is_fp8_model(vllm_config)

        vllm_refit.patch(module, "is_fp8_model", is_fp8_model)
    logger.warning(
        "nemo_ais: %s.load_weights wrapped in pid %d: the BF16 refit is quantized to %s by nemo_ais (backend %s)",
        module.__name__,
        os.getpid(),
        config.format,
        config.backend,
    )
    return True


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, config: RefitConfig):
        self.inner, self.config = inner, config

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        install(module, self.config)


def patched_spec(fullname: str, config: RefitConfig | None) -> Any:
    """The spec of ``fullname`` whose loader then runs :func:`install` (TypeError: no config)."""
    require_config(config, RefitConfig, "patched_spec(config)")
    ours = [f for f in sys.meta_path if isinstance(f, _Finder) and f.target == fullname]
    for finder in ours:  # find the real spec without recursing into this hook
        sys.meta_path.remove(finder)
    try:
        spec = importlib.util.find_spec(fullname)
    finally:
        sys.meta_path[:0] = ours
    if spec is not None and spec.loader is not None:
        spec.loader = _Loader(spec.loader, config)
    return spec


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, target: str, config: RefitConfig):
        self.target, self.config = target, config

    def find_spec(self, fullname, path, target=None):
        return patched_spec(fullname, self.config) if fullname == self.target else None


def install_on_import(config: RefitConfig, target: str = TARGET_MODULE) -> None:
    """Patch ``target`` when it is imported (now, if it already is); the config is checked now."""
    require_config(config, RefitConfig, "install_on_import(config)")
    module = sys.modules.get(target)
    if module is not None:
        install(module, config)
        return
    if not any(isinstance(f, _Finder) and f.target == target for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(target, config))


class HookStatus(NamedTuple):
    """The AIS refit in one process (a vLLM worker), as :func:`hook_status` sees it."""

    pid: int
    host: str
    configured: bool  # NEMO_AIS_REFIT set in this process
    armed: bool  # an import hook waits for NeMo-RL's FP8 refit module
    imported: bool  # that module is imported here
    patched: bool  # and its load_weights is ours
    error: str | None  # what the hook raised when the module was imported

    @property
    def active(self) -> bool:
        """The next refit in this process quantizes with nemo_ais."""
        return self.error is None and (self.patched or (self.armed and not self.imported))

    def problem(self) -> str:
        """Why the refit is not active here ('' if it is)."""
        if self.active:
            return ""
        if self.error is not None:
            return f"the hook failed when NeMo-RL's FP8 module was imported: {self.error}"
        if not self.configured:
            return f"{ENV_VAR} is not set in this process (the launcher's environment did not reach it)"
        if self.imported:
            return f"{TARGET_MODULE}.load_weights is NeMo-RL's own (imported before the hook)"
        return (
            "no hook is armed: nemo_ais/nemo_rl/_vllm_hook/sitecustomize.py did not run "
            "(not on PYTHONPATH, or another sitecustomize earlier on sys.path shadows it)"
        )


def hook_status(worker: Any = None) -> HookStatus:
    """This process's AIS refit state (``worker``: what vLLM's ``collective_rpc`` passes)."""
    module = sys.modules.get(TARGET_MODULE)
    hooks = [f for f in sys.meta_path if getattr(f, "nemo_ais_fp8_refit", False)]
    finders = [f for f in sys.meta_path if isinstance(f, _Finder) and f.target == TARGET_MODULE]
    return HookStatus(
        pid=os.getpid(),
        host=socket.gethostname(),
        configured=bool(os.environ.get(ENV_VAR)),
        armed=bool(hooks or finders),
        imported=module is not None,
        patched=module is not None and getattr(module.load_weights, PATCHED, False),
        error=next((f.error for f in hooks if getattr(f, "error", None)), None),
    )


def _engine_statuses(generation_worker: Any) -> list[HookStatus]:
    """On a NeMo-RL vLLM generation worker (Ray actor): every vLLM worker process's status."""
    if getattr(generation_worker, "llm", None) is None:  # no engine: the actor's own process
        return [hook_status()]
    return engine_rpc(generation_worker, hook_status)


def require_active(policy_generation: Any) -> list[HookStatus]:
    """Every vLLM worker process's refit status (RuntimeError naming each one not active).

    AsyncEngineUnreachable: every process read is active, and some async engine could not be read (each named).
    """
    per_worker, unreached = ask_engines(policy_generation, _engine_statuses)
    problems = [
        f"generation worker {w}, vLLM process {s.pid} on {s.host}: {s.problem()}"
        for w, statuses in enumerate(per_worker)
        for s in statuses
        if not s.active
    ]
    if problems:
        logger.warning("nemo_ais: AIS refit NOT active: %s", "; ".join(problems))
    head = (
        "ais_fp8_refit (or ais_nvfp4_refit).enabled=true but the AIS refit hook is not active in every vLLM worker, "
        "which would refit with NeMo-RL's own quantizer (or, NVFP4, not at all):"
    )
    raise_engine_problems(head, problems, unreached)
    statuses = [s for group in per_worker for s in group]
    logger.warning(
        "nemo_ais: AIS refit armed in %d vLLM worker processes of %d generation workers", len(statuses), len(per_worker)
    )
    return statuses


def _section_of(value: Any) -> str:
    fmt = value.get("format", "fp8") if isinstance(value, Mapping) else value.format
    return "fp8" if fmt == Fp8SyncConfig.model_fields["format"].default else "block"


_ENV_CONFIG = TypeAdapter(
    Annotated[
        Annotated[Fp8SyncConfig, Tag("fp8")] | Annotated[BlockSyncConfig, Tag("block")], Discriminator(_section_of)
    ]
)  # the section's own config class, told apart by its format (absent: fp8)


def config_from_env(environ: Mapping[str, str] | None = None) -> RefitConfig | None:
    """The :class:`~nemo_ais.refit.config.RefitConfig` in :data:`ENV_VAR` (None when unset)."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR)
    return _ENV_CONFIG.validate_json(raw) if raw else None


def configure(
    config: Mapping[str, Any], environ: dict[str, str] | None = None, section: str = "ais_fp8_refit"
) -> RefitConfig | None:
    """Arm the refit from one of :data:`SECTIONS` (None: the section is absent or disabled).

    The section is read by :func:`~nemo_ais.refit.config.section_config` (the engine's defaults; the offline check
    reads it the same way). Sets :data:`ENV_VAR` (``input_amax_file`` made absolute, from the driver's working
    directory) and puts :data:`HOOK_DIR` first on ``PYTHONPATH`` (before Ray starts).

    Raises:
        ValueError: naming the field (invalid section, format or engine, both enabled).
    """
    refit_cfg = section_config(config, section, _upstream_ignore)
    if refit_cfg is None or not refit_cfg.enabled:
        return None
    problems = _configure_problems(config, get(config, "policy.generation", {}), refit_cfg, section)
    if problems:
        raise ValueError("; ".join(problems))
    if refit_cfg.input_amax_file is not None:  # a vLLM worker's working directory need not be the driver's
        absolute = os.path.join(os.getcwd(), refit_cfg.input_amax_file)  # no ".." folded: the file read here
        refit_cfg = refit_cfg.model_copy(update={"input_amax_file": absolute})
    environ = os.environ if environ is None else environ
    environ[ENV_VAR] = refit_cfg.model_dump_json()
    parts = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    hook = str(HOOK_DIR)
    environ["PYTHONPATH"] = os.pathsep.join([hook, *(p for p in parts if p != hook)])
    return refit_cfg


def _upstream_ignore() -> list[str]:
    from nemo_rl.modelopt.utils import DEFAULT_NVFP4_IGNORE  # NeMo-RL's own default (real_quant_ignore absent)

    return list(DEFAULT_NVFP4_IGNORE)


def _configure_problems(
    config: Mapping[str, Any], generation: Mapping[str, Any], refit_cfg: RefitConfig, section: str
) -> list[str]:
    precision = get(generation, "vllm_cfg.precision")
    if section == "ais_fp8_refit":
        # the weight_scale_inv shape the engine's loader checks
        problems = [fp8_refit_precision_problem(precision), fp8_refit_block_problem(refit_cfg.block)]
        return [p for p in problems if p]
    problems = []
    if _engine(refit_cfg) is not ENGINES["nvfp4"]:
        problems.append(
            f"{section}.format={refit_cfg.format!r} is invalid: expected nvfp4_w4a16 or nvfp4_w4a4 (MXFP8 rollouts "
            "refit through NeMo-RL main's own MXFP8 quantizer, the same bytes)"
        )
    if get_format(refit_cfg.format).static_input_amax and refit_cfg.input_amax_file is None:
        problems.append(
            f"{section}.input_amax_file=None is invalid with format nvfp4_w4a4: expected a JSON {{module or fused "
            "group: calibrated input amax} (the refit streams input_scale = amax / (6 * 448))"
        )
    elif get_format(refit_cfg.format).static_input_amax:
        try:  # here, before Ray: each vLLM worker reads it again when the hook arms
            read_input_amax_file(refit_cfg.input_amax_file)
        except ValueError as err:
            problems.append(f"{section}.{err}")
    if generation.get("real_quant") is not True:
        problems.append(
            f"{section}.enabled=true needs policy.generation.real_quant: true (got {generation.get('real_quant')!r}): "
            "it quantizes the refit for NeMo-RL's ModelOpt NVFP4 vLLM engine"
        )
    fp8 = config.get("ais_fp8_refit")
    if isinstance(fp8, Mapping) and fp8.get("enabled", True):
        problems.append(
            f"ais_fp8_refit and {section} are both enabled: one engine has one weight "
            "format (set ais_fp8_refit.enabled: false)"
        )
    return problems
