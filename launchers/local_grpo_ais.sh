#!/usr/bin/env bash
# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
#
# Usage: launchers/local_grpo_ais.sh [--dry-run] [--skip-check] CONFIG [OVERRIDE ...]
#
# Runs NeMo-RL (v0.7.0 or main) GRPO with the AIS loss on this machine (one node, Ray started by
# NeMo-RL): `uv run python launchers/run_grpo_ais.py --config CONFIG [OVERRIDE ...]`
# from the NeMo-RL checkout, with nemo_ais on PYTHONPATH (Ray workers inherit it).
#
#   CONFIG      a YAML under configs/nemo_rl/ (cluster.num_nodes must be 1)
#   OVERRIDE    Hydra-style: key=value, +new.key=value, ~key
#   --dry-run   print the commands (cd, environment, launch line) instead of running them
#   --skip-check  do not run the offline config check first
#   -h, --help  this text
#
# Environment:
#   NEMO_RL_DIR   (required) NeMo-RL v0.7.0 or main checkout; the job runs there, in its uv env
#   NEMO_AIS_DIR  nemo_ais checkout put on PYTHONPATH (default: this script's repository)
#   RUNNER        launcher of the entry point (default: "uv run python"; e.g. "python"
#                 inside an activated NeMo-RL environment)
#   PYTHON        interpreter for the offline check (default: python3; Python >= 3.11
#                 with pydantic, omegaconf, pyyaml -- not torch, not NeMo-RL)
set -euo pipefail

SCRIPT_NAME=local_grpo_ais.sh
# shellcheck source=launchers/_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
parse_args "$@"
[[ -n "${NEMO_RL_DIR:-}" ]] || die "NEMO_RL_DIR is not set: export NEMO_RL_DIR=/path/to/NeMo-RL (a v0.7.0 or main checkout)"
[[ -d "$NEMO_RL_DIR/nemo_rl" ]] || die "NEMO_RL_DIR=$NEMO_RL_DIR is not a NeMo-RL checkout (no nemo_rl/ package in it)"
read -r -a runner <<< "${RUNNER:-uv run python}"
pythonpath="$(pythonpath_with "$NEMO_AIS_DIR")"   # no empty entry (= the cwd)

if ((check)); then
  check_python "$pythonpath"
  # torch-free: needs pydantic, omegaconf and pyyaml only (nemo_ais/preflight/__init__.py)
  nodes="$(PYTHONPATH="$pythonpath" "${PYTHON:-python3}" -P -m nemo_ais.preflight \
    --get cluster.num_nodes "$config" "${overrides[@]}")" \
    || die_check_failed
  [[ "$nodes" == 1 ]] || die "$config runs on cluster.num_nodes=$nodes: use launchers/slurm_grpo_ais.sh"
fi

launch=("${runner[@]}" "$NEMO_AIS_DIR/launchers/run_grpo_ais.py" --config "$config" "${overrides[@]}")
if ((dry_run)); then
  printf 'cd %s\n' "$(shq "$NEMO_RL_DIR")"
  printf 'export PYTHONPATH=%s\n' "$(shq "$pythonpath")"
  printf '%s\n' "$(shq_words "${launch[@]}")"
  exit 0
fi
cd "$NEMO_RL_DIR"
export PYTHONPATH="$pythonpath"
exec "${launch[@]}"
