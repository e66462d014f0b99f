# shellcheck shell=bash
# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
#
# Defines `pythonpath_with DIR`: prints DIR, then every non-empty entry of the inherited
# $PYTHONPATH except DIR itself, joined by ':'. Never an empty entry: an empty entry (a
# leading or trailing ':' or a '::', e.g. from `DIR:${PYTHONPATH:-}` with PYTHONPATH unset)
# means the working directory, and on the driver's and every Ray worker's sys.path it lets
# any file there shadow a module of the same name.
# Sourced by _common.sh (both launchers) and by the Slurm job's COMMAND, which runs it in
# the container, where the image's own PYTHONPATH is known.

pythonpath_with() {
  local out="$1" entry
  local -a entries=()
  IFS=: read -r -a entries <<< "${PYTHONPATH:-}"
  for entry in "${entries[@]}"; do
    [[ -z "$entry" || "$entry" == "$1" ]] || out+=":$entry"
  done
  printf '%s\n' "$out"
}
