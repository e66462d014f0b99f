# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``python -m nemo_ais.preflight CONFIG [OVERRIDE ...] [--quiet] [--get KEY] [--paths] ...``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from nemo_ais.preflight.checks import check_config
from nemo_ais.preflight.checks.formats import reads_input_amax_file
from nemo_ais.preflight.loader import get, has, is_mixin, load_config
from nemo_ais.preflight.nemo_rl_target import NEMO_RL_VERSIONS

PROG = "python -m nemo_ais.preflight"

RUN_DIR_KEYS = ("checkpointing.checkpoint_dir", "logger.log_dir")
"""Directories the job writes (the Slurm launcher creates and mounts an absolute one, shared by every node)."""

READ_DIR_KEYS = (
    "policy.model_name",
    "policy.tokenizer.name",
    "policy.pretrained_checkpoint.path",
    "checkpointing.pretrained_checkpoint.path",
)
"""A Hugging Face id or a directory every node reads (the model, a Megatron checkpoint to start from): an absolute
path is a directory to mount (``checkpointing.pretrained_checkpoint`` is copied into the policy by ``grpo.setup``)."""

DATA_FILE_LEAVES = frozenset({"data_path", "prompt_file", "system_prompt_file"})
"""Keys under ``data`` naming a file the driver reads (NeMo-RL's dataset configs); an absolute one is mounted."""


class JobPath(NamedTuple):
    """A host path the job writes (a directory) or reads, and the config key naming it; ``*_file`` keys name files."""

    key: str
    path: str
    writes: bool


def job_paths(cfg: Mapping[str, Any]) -> list[JobPath]:
    """The paths the job writes (:data:`RUN_DIR_KEYS`), then those it reads; unset and null ones are left out.

    Read, when absolute: :data:`READ_DIR_KEYS` and the ``data`` section's :data:`DATA_FILE_LEAVES`; and the NVFP4
    refit's ``input_amax_file`` (W4A4, relative or not), which the driver and every vLLM worker read.
    """
    paths = [JobPath(key, get(cfg, key), True) for key in RUN_DIR_KEYS]
    reads = [(key, get(cfg, key)) for key in READ_DIR_KEYS] + _data_files(get(cfg, "data"), "data")
    paths += [JobPath(key, path, False) for key, path in reads if isinstance(path, str) and path.startswith("/")]
    refit = get(cfg, "ais_nvfp4_refit")
    if reads_input_amax_file(refit):
        paths.append(JobPath("ais_nvfp4_refit.input_amax_file", refit.get("input_amax_file"), False))
    return [p for p in paths if isinstance(p.path, str) and p.path]


def _data_files(node: Any, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, value) of each :data:`DATA_FILE_LEAVES` key below ``node`` (mappings and lists)."""
    items = node.items() if isinstance(node, Mapping) else enumerate(node) if isinstance(node, list) else ()
    found = []
    for name, value in items:
        key = f"{prefix}.{name}"
        found += [(key, value)] if name in DATA_FILE_LEAVES else _data_files(value, key)
    return found


def split_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(YAML paths, Hydra-style overrides) of the positional arguments."""
    paths = [a for a in args if a.endswith((".yaml", ".yml")) and "=" not in a]
    return paths, [a for a in args if a not in paths]


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """CLI: print the check results of each config; exit 1 if any check fails.

    ``--get KEY`` (for scripts, repeatable) prints failures and warnings to stderr and exits 1 on a failure, else prints
    the resolved values (one line per config, YAML spellings: ``null``, ``true``) and exits 0; an absent key fails.
    ``--paths`` then prints ``writes KEY=PATH`` or ``reads KEY=PATH`` a line for each of :func:`job_paths`.
    ``--quiet``: no warnings.
    """
    parser = argparse.ArgumentParser(
        prog=prog, description="Check NeMo-RL GRPO+AIS configs offline (parallel sizes, FP8 shards, loss_fn.ais)."
    )
    parser.add_argument("configs", nargs="+", help="YAML files, then Hydra-style overrides (k=v)")
    parser.add_argument(
        "--get",
        metavar="KEY",
        action="append",
        help="if the checks pass, print this resolved value as YAML spells it (null, true, "
        "8, ...; repeatable: one line, space-separated); a key that is absent fails",
    )
    parser.add_argument(
        "--paths",
        action="store_true",
        help="if the checks pass, print 'writes KEY=PATH' or 'reads KEY=PATH' a line for each host path the job "
        "writes or reads (checkpoint and log directories; an absolute model, checkpoint or data path; the W4A4 "
        "ais_nvfp4_refit.input_amax_file), "
        "after the --get line",
    )
    parser.add_argument("--quiet", action="store_true", help="print failures only (to stderr)")
    parser.add_argument(
        "--nemo-rl-version",
        choices=NEMO_RL_VERSIONS,
        help="the NeMo-RL the job runs on, for the rollout formats only some versions have "
        "(NVFP4 W4A4, MXFP8: main); default: read the source at $NEMO_RL_DIR, else warn",
    )
    args = parser.parse_args(argv)
    paths, overrides = split_args(args.configs)
    if not paths:
        parser.error("give at least one .yaml config")
    script = args.get is not None or args.paths  # values on stdout, what the checks say on stderr
    n_failed = 0
    for path in paths:
        try:
            cfg = load_config(path, overrides)
        except (OSError, TypeError, ValueError) as err:
            print(f"{path}: cannot load: {err}", file=sys.stderr)
            n_failed += 1
            continue
        results = check_config(cfg, args.nemo_rl_version)
        failed = [r for r in results if r.status == "fail"]
        n_failed += bool(failed)
        if not (args.quiet or script):
            full = not is_mixin(cfg) and "policy" in cfg and "cluster" in cfg
            print(path + (_layout_line(cfg) if full else ""))
            print("\n".join(f"  {r}" for r in results))
        elif told := [r for r in results if r in failed or (r.status == "warn" and not args.quiet)]:
            print(f"{path}:", *(f"  {r}" for r in told), sep="\n", file=sys.stderr)
        if script and is_mixin(cfg):
            print(
                f"{path}: an arm mixin (no policy/cluster section), not a full config: name it "
                f"after a model config in a defaults: list (see configs/nemo_rl/experiments/)",
                file=sys.stderr,
            )
            n_failed += 1
        elif script and not failed:
            n_failed += not _print_values(path, cfg, args.get or [], job_paths(cfg) if args.paths else [])
    return 1 if n_failed else 0


def _print_values(path: str, cfg: Mapping[str, Any], keys: Sequence[str], job: Sequence[JobPath]) -> bool:
    """``--get``'s values line (if any keys), then ``--paths``' lines; False (said on stderr) if one cannot be."""
    if unset := [key for key in keys if not has(cfg, key)]:
        print(f"{path}: {', '.join(unset)} not set", file=sys.stderr)
        return False
    values = [(key, _yaml_word(get(cfg, key))) for key in keys]
    if bad := [f"{k}={v!r}" for k, v in values + [(p.key, p.path) for p in job] if "\n" in v]:
        print(f"{path}: {', '.join(bad)} is invalid: expected a value without a newline", file=sys.stderr)
        return False
    if keys:
        print(*(value for _, value in values))
    for p in job:
        print(f"{'writes' if p.writes else 'reads'} {p.key}={p.path}")
    return True


def _yaml_word(value: Any) -> str:
    """``None`` -> ``null``, ``True`` -> ``true``; anything else as ``str``."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _layout_line(cfg: Mapping[str, Any]) -> str:
    nodes, gpus = get(cfg, "cluster.num_nodes", 1), get(cfg, "cluster.gpus_per_node", 1)
    total = nodes * gpus if type(nodes) is int and type(gpus) is int else "?"  # parallel_sizes names a bad one
    return f" ({get(cfg, 'policy.model_name')}, {nodes} node(s) x {gpus} GPU(s) = {total})"
