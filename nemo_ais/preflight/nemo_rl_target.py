# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Which NeMo-RL a config will run on, and which low-precision rollout formats it has.

Never imports ``nemo_rl``. The target comes from ``--nemo-rl-version`` (:data:`ROLLOUT_FORMATS`), else from one probe
text per format in the ``NEMO_RL_DIR`` checkout, else unknown: format checks warn (docs/cluster.md, "Which NeMo-RL").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

NEMO_RL_VERSIONS = ("v0.7.0", "main")
"""The NeMo-RL versions nemo_ais supports (``nemo_ais.nemo_rl.compat.SUPPORTED``'s keys)."""

# A file every NeMo-RL checkout has: without it NEMO_RL_DIR is not one.
_CHECKOUT_MARKER = "nemo_rl/algorithms/grpo.py"


@dataclass(frozen=True)
class FormatSupport:
    """One rollout format: its name in messages, the versions that have it, its probe, the switches that select it."""

    label: str
    versions: tuple[str, ...]
    probe_file: str  # relative to the NeMo-RL checkout
    probe_text: str  # present in probe_file exactly when the checkout supports the format
    selector: str = ""  # the config switches, as a reader finds them; {quant_cfg}: the config's value (repr)


_REAL_QUANT = "policy.generation.real_quant=true with policy.generation.quant_cfg={quant_cfg}"
ROLLOUT_FORMATS: dict[str, FormatSupport] = {
    "nvfp4_w4a16": FormatSupport(
        "NVFP4 W4A16 (ModelOpt real-quant) rollout",
        ("v0.7.0", "main"),
        "nemo_rl/modelopt/utils.py",
        "def build_vllm_modelopt_nvfp4_config",
        _REAL_QUANT,
    ),
    "nvfp4_w4a4": FormatSupport(
        "NVFP4 W4A4 (ModelOpt real-quant) rollout",
        ("main",),
        "nemo_rl/modelopt/utils.py",
        "def resolve_nvfp4_real_quant_mode",
        _REAL_QUANT,
    ),
    "mxfp8": FormatSupport(
        "MXFP8 rollout",
        ("main",),
        "nemo_rl/models/generation/vllm/quantization/fp8.py",
        "is_mx",
        "policy.generation.vllm_cfg.is_mx=true",
    ),
}
"""The rollout formats only some supported NeMo-RL versions have (module table)."""

NESTED_BF16_LAYERS = FormatSupport(
    "num_first_layers_in_bf16 / num_last_layers_in_bf16 as one nested list",
    ("v0.7.0",),
    "nemo_rl/models/generation/vllm/quantization/fp8.py",
    "bf16_params.append(_get_params_in_layers",
)
"""v0.7.0's ``init_fp8`` appends the BF16 layers' names to vLLM's ``ignored_layers`` as ONE
list element (main extends the list): vLLM's by-name match does not look into it."""


@dataclass(frozen=True)
class NeMoRLTarget:
    """The NeMo-RL a config is checked against: a name and the formats it supports."""

    name: str  # "NeMo-RL v0.7.0", "NeMo-RL main", or "the NeMo-RL at NEMO_RL_DIR=/path"
    formats: frozenset[str]  # keys of ROLLOUT_FORMATS
    nests_bf16_layers: bool = False  # NESTED_BF16_LAYERS


def target_from_version(version: str) -> NeMoRLTarget:
    """The target of a supported version name (:data:`NEMO_RL_VERSIONS`; else ``ValueError``)."""
    if version not in NEMO_RL_VERSIONS:
        raise ValueError(f"--nemo-rl-version={version!r} is invalid: expected one of {list(NEMO_RL_VERSIONS)}")
    formats = frozenset(k for k, f in ROLLOUT_FORMATS.items() if version in f.versions)
    return NeMoRLTarget(f"NeMo-RL {version}", formats, version in NESTED_BF16_LAYERS.versions)


def target_from_checkout(path: str | Path) -> NeMoRLTarget | None:
    """The formats a NeMo-RL checkout supports, by reading its source; None if not one."""
    root = Path(path).expanduser()
    if not (root / _CHECKOUT_MARKER).is_file():
        return None

    def has(support: FormatSupport) -> bool:
        probe = root / support.probe_file
        return probe.is_file() and support.probe_text in probe.read_text(errors="replace")

    formats = frozenset(key for key, support in ROLLOUT_FORMATS.items() if has(support))
    name = f"the NeMo-RL at NEMO_RL_DIR={root}"
    return NeMoRLTarget(name, formats, has(NESTED_BF16_LAYERS))


def resolve_target(
    version: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[NeMoRLTarget | None, str]:
    """(target, how it was found): ``version``, else ``NEMO_RL_DIR``'s source, else None."""
    if version is not None:
        return target_from_version(version), f"checked against NeMo-RL {version} (given)"
    env = os.environ if environ is None else environ
    checkout = env.get("NEMO_RL_DIR")
    if not checkout:
        return None, "NeMo-RL version unknown (NEMO_RL_DIR unset, no --nemo-rl-version)"
    target = target_from_checkout(checkout)
    if target is None:
        return None, f"NeMo-RL version unknown (NEMO_RL_DIR={checkout} has no {_CHECKOUT_MARKER})"
    return target, f"checked against {target.name} (its source)"
