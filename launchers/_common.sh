# shellcheck shell=bash
# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
#
# Shared by local_grpo_ais.sh and slurm_grpo_ais.sh (sourced, not run): usage text,
# shell quoting, errors and the common command line
#   [--dry-run] [--skip-check] CONFIG [OVERRIDE ...]
# Callers set SCRIPT_NAME, then call `parse_args "$@"`, which sets dry_run, check, config
# (absolute path), overrides (array) and NEMO_AIS_DIR.

# shellcheck source=launchers/_pythonpath.sh
source "$(dirname "${BASH_SOURCE[0]}")/_pythonpath.sh"

# The calling script's header comment, from its "Usage:" line down to `set -euo`.
usage() { sed -n '/^# Usage:/,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
# Shell-quote one word, readably: bare if safe, else in single quotes.
shq() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then
    printf '%s' "$1"
  else
    local q="'"
    printf "'%s'" "${1//$q/$q\\$q$q}"
  fi
}
shq_words() { local w out=(); for w in "$@"; do out+=("$(shq "$w")"); done; printf '%s' "${out[*]}"; }
die() { echo "$SCRIPT_NAME: error: $*" >&2; exit 2; }
# The offline check failed: stop, naming the command that reproduces it (overrides too, and
# NEMO_RL_DIR: the check reads the NeMo-RL version there).
die_check_failed() {
  local env=""
  [[ -z "${NEMO_RL_DIR:-}" ]] || env="NEMO_RL_DIR=$(shq "$NEMO_RL_DIR") "
  die "$config fails the offline checks above (${env}python -m nemo_ais.preflight $(shq_words "$config" "${overrides[@]}"))"
}

# What the offline check needs (nemo_ais/preflight/requirements.py describe(); a test keeps
# the two equal).
PREFLIGHT_NEEDS="Python >= 3.11 with pydantic>=2.7, omegaconf>=2.3, pyyaml>=6.0, hydra-core>=1.3"

# `check_python PYTHONPATH`: stop, in one line naming PYTHON, unless ${PYTHON:-python3} can run
# the offline check (nemo_ais/preflight/requirements.py: version and packages, or why not).
check_python() {
  local py="${PYTHON:-python3}" why
  if why="$(PYTHONPATH="$1" "$py" "$NEMO_AIS_DIR/nemo_ais/preflight/requirements.py" 2>&1)"; then
    return 0
  fi
  why="${why##*$'\n'}"   # the last line: the probe's message, or a traceback's error
  die "PYTHON=$py cannot run the offline check (${why:-no output}): set PYTHON=/path/to/python \
($PREFLIGHT_NEEDS; launchers/README.md), or pass --skip-check"
}

parse_args() {
  dry_run=0
  check=1
  local positional=()
  while (($#)); do
    case "$1" in
      -h | --help) usage; exit 0 ;;
      --dry-run) dry_run=1 ;;
      --skip-check) check=0 ;;
      --) shift; positional+=("$@"); break ;;
      -*) die "unknown option $1 (see --help)" ;;
      *) positional+=("$1") ;;
    esac
    shift
  done
  ((${#positional[@]})) || die "missing CONFIG (see --help)"
  config="${positional[0]}"
  overrides=("${positional[@]:1}")
  [[ -f "$config" ]] || die "config $config does not exist"
  config="$(cd "$(dirname "$config")" && pwd)/$(basename "$config")"
  NEMO_AIS_DIR="${NEMO_AIS_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
  [[ "$NEMO_AIS_DIR" != *:* ]] || die "NEMO_AIS_DIR=$NEMO_AIS_DIR contains ':' (it must be one PYTHONPATH entry)"
}
