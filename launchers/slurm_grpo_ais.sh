#!/usr/bin/env bash
# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
#
# Usage: launchers/slurm_grpo_ais.sh [--dry-run] [--skip-check] CONFIG [OVERRIDE ...]
#
# Submits NeMo-RL (v0.7.0 or main) GRPO with the AIS loss as a multi-node Slurm job through
# NeMo-RL's ray.sub: `sbatch --nodes=N ... $NEMO_RL_DIR/ray.sub`, submitted from the
# NeMo-RL checkout (ray.sub's working directory), with
#   COMMAND = source $NEMO_AIS_DIR/launchers/_pythonpath.sh &&
#             export PYTHONPATH="$(pythonpath_with $NEMO_AIS_DIR)" && uv run python \
#             $NEMO_AIS_DIR/launchers/run_grpo_ais.py --config CONFIG [OVERRIDE ...]
# (PYTHONPATH = nemo_ais, then the container's non-empty entries: never an empty entry,
# which would put the working directory on every Ray worker's sys.path.)
# nemo_ais is on PYTHONPATH in the driver and NeMo-RL forwards it to the Ray workers.
# N and GPUS_PER_NODE come from the config's cluster section (after the overrides).
#
#   CONFIG        a YAML under configs/nemo_rl/
#   OVERRIDE      Hydra-style: key=value, +new.key=value, ~key
#   --dry-run     print the commands (cd, environment, mkdir of the directories the job
#                 writes, sbatch line) instead of submitting
#   --skip-check  do not run the offline config check (then NUM_NODES and GPUS_PER_NODE
#                 must be set)
#   -h, --help    this text
#
# Environment (required):
#   NEMO_RL_DIR   NeMo-RL v0.7.0 or main checkout, on a filesystem the compute nodes see
#                 (with several nodes a warning if node-local while the config's checkpoint or
#                 log directory or input_amax_file is relative: those resolve under it)
#   CONTAINER     container image for ray.sub (e.g. a NeMo-RL v0.7.0 or main .sqsh)
#   ACCOUNT       Slurm account
#   PARTITION     Slurm partition
# Environment (optional):
#   NEMO_AIS_DIR  nemo_ais checkout (default: this script's repository)
#   JOB_NAME      default: nemo-ais-<config file name without .yaml>
#   TIME          wall-clock limit (default: 04:00:00; Slurm's formats). With checkpoints on
#                 and checkpointing.checkpoint_must_save_by null in the config, the job gets
#                 checkpointing.checkpoint_must_save_by=TIME - SAVE_MARGIN: NeMo-RL saves and
#                 stops before Slurm kills it; submit the same command again to resume
#                 (ray.sub's --dependency=singleton runs it after this one)
#   SAVE_MARGIN   time kept for start-up and the last save (default: 20 = 20 minutes)
#   NUM_NODES, GPUS_PER_NODE   must equal the config's cluster.num_nodes / gpus_per_node
#   GRES          e.g. gpu:8, adds --gres=$GRES (clusters that need it)
#   HF_HOME       Hugging Face cache: created if missing, mounted and exported to the job
#   NRL_MEGATRON_CHECKPOINT_DIR  where NeMo-RL puts the converted Megatron checkpoint
#                 (default $HF_HOME/nemo_rl): created if missing, mounted and exported to
#                 the job. With more than one node one of the two must be set, and each
#                 that is set must be on a filesystem every node mounts (refused if it is
#                 node-local here)
#   EXTRA_MOUNTS  comma-separated src:dst container mounts to add (an absolute
#                 checkpointing.checkpoint_dir or logger.log_dir is created, mounted, and with
#                 several nodes refused if node-local; what the job reads (an absolute
#                 policy.model_name, tokenizer.name, pretrained_checkpoint.path or data file,
#                 the W4A4 ais_nvfp4_refit.input_amax_file) is mounted if this node has it,
#                 with a warning if not or if node-local; a path to mount may not hold
#                 whitespace, ',' or ':')
#   SBATCH_ARGS   extra sbatch arguments (space-separated; not --time, --job-name, --nodes:
#                 TIME, JOB_NAME and the config's cluster.num_nodes set them)
#   PYTHON        interpreter for the offline check (default: python3; Python >= 3.11
#                 with pydantic, omegaconf, pyyaml -- not torch, not NeMo-RL)
set -euo pipefail

SCRIPT_NAME=slurm_grpo_ais.sh
# shellcheck source=launchers/_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
parse_args "$@"
missing=()
for var in NEMO_RL_DIR CONTAINER ACCOUNT PARTITION; do
  [[ -n "${!var:-}" ]] || missing+=("$var")
done
((${#missing[@]} == 0)) || die "set ${missing[*]} (see --help): e.g. NEMO_RL_DIR=/path/to/NeMo-RL \
CONTAINER=/path/to/nemo_rl.sqsh ACCOUNT=my_account PARTITION=batch $0 $config"
[[ -f "$NEMO_RL_DIR/ray.sub" ]] || die "NEMO_RL_DIR=$NEMO_RL_DIR has no ray.sub (expected a NeMo-RL v0.7.0 or main checkout)"

NEMO_RL_DIR="$(cd "$NEMO_RL_DIR" && pwd)"  # absolute: the job runs there and its relative paths resolve there
NEMO_AIS_DIR="$(cd "$NEMO_AIS_DIR" && pwd)"
run_dirs=()  # "writes|reads KEY=PATH": directories the job writes, paths it reads, outside NEMO_RL_DIR (folded)
relative_dirs=()  # the keys of the relative ones: under NEMO_RL_DIR, ray.sub's working directory
read_paths=()
if ((check)); then
  check_python "$(pythonpath_with "$NEMO_AIS_DIR")"
  # torch-free: needs pydantic, omegaconf and pyyaml only (nemo_ais/preflight/__init__.py). One call:
  # its warnings (stderr) are said once; the values, then "writes|reads KEY=PATH" a line (no newline in a value)
  checked="$(PYTHONPATH="$(pythonpath_with "$NEMO_AIS_DIR")" "${PYTHON:-python3}" -P -m nemo_ais.preflight \
    --get cluster.num_nodes --get cluster.gpus_per_node --get checkpointing.enabled \
    --get checkpointing.checkpoint_must_save_by --paths "$config" "${overrides[@]}")" || die_check_failed
  {
    read -r cfg_nodes cfg_gpus cfg_checkpoints cfg_save_by more
    [[ -n "${cfg_save_by:-}" && -z "${more:-}" ]] || die "the offline check printed '${cfg_nodes:-} ${cfg_gpus:-} \
${cfg_checkpoints:-} ${cfg_save_by:-} ${more:-}' for cluster.num_nodes, cluster.gpus_per_node, checkpointing.enabled \
and checkpointing.checkpoint_must_save_by (expected four words)"
    while IFS= read -r line; do
      kind="${line%% *}"
      pair="${line#* }"
      [[ "$kind" == writes || "$kind" == reads ]] || die "the offline check printed '$line' (expected \
'writes KEY=PATH' or 'reads KEY=PATH')"
      key="${pair%%=*}"
      path="${pair#*=}"
      relative=0
      [[ "$path" == /* ]] || { relative=1; path="$NEMO_RL_DIR/$path"; }
      path="$(realpath -m -s -- "$path")"  # ".." folded as in the container, where no link is followed
      if ((relative)) && [[ "$path" == "$NEMO_RL_DIR" || "$path" == "$NEMO_RL_DIR"/* ]]; then
        relative_dirs+=("$key")  # a ../ out of the checkout counts as absolute
      elif [[ " ${read_paths[*]-} " != *" $path "* ]]; then  # a path read twice (model, tokenizer): once
        run_dirs+=("$kind $key=$path")
        [[ "$kind" == writes ]] || read_paths+=("$path")
      fi
    done
  } <<< "$checked"
  for pair in "NUM_NODES:$cfg_nodes:num_nodes" "GPUS_PER_NODE:$cfg_gpus:gpus_per_node"; do
    IFS=: read -r var want key <<< "$pair"
    [[ -z "${!var:-}" || "${!var}" == "$want" ]] \
      || die "$var=${!var} but the config has cluster.$key=$want (override it: cluster.$key=${!var})"
  done
  NUM_NODES="$cfg_nodes"
  GPUS_PER_NODE="$cfg_gpus"
else
  [[ -n "${NUM_NODES:-}" && -n "${GPUS_PER_NODE:-}" ]] \
    || die "--skip-check needs NUM_NODES and GPUS_PER_NODE (the config's cluster.num_nodes / gpus_per_node)"
  # the paths come from the config, which only the check reads
  echo "$SCRIPT_NAME: warning: --skip-check does not read the config, so it neither creates, mounts nor \
checks an absolute checkpointing.checkpoint_dir or logger.log_dir (the job would write it inside the container \
and a resubmission start from step 0), and does not mount what the job reads (an absolute model, pretrained \
checkpoint or data path, ais_nvfp4_refit.input_amax_file). Create them and add them to EXTRA_MOUNTS (src:dst)" >&2
fi

[[ "$NUM_NODES" =~ ^[1-9][0-9]*$ ]] || die "NUM_NODES=$NUM_NODES is not a positive integer"

# Top-level directories a container image has of its own (a mount there would hide them).
IMAGE_DIRS=" /bin /boot /dev /etc /lib /lib64 /opt /proc /root /run /sbin /srv /sys /tmp /usr /var /workspace "
# Filesystem types (as `stat -f -c %T` prints them) that live on one node only.
NODE_LOCAL_FS=" tmpfs ramfs overlayfs overlay ext2/ext3 ext4 xfs btrfs zfs squashfs devtmpfs "

# `check_shared VAR [PATH [WHY [warn|reads]]]`: with several nodes, stop (or with `warn`, warn; with
# `reads`, warn that each node needs its own copy) unless $VAR (or the config key VAR's PATH) is on a
# filesystem every node sees, judged from this node by the filesystem of the path or of its nearest
# existing parent.
check_shared() {
  local var="$1" path="${2-${!1}}" dir fstype top
  local need="with cluster.num_nodes=$NUM_NODES it must be on a filesystem every node mounts \
(NFS, Lustre, GPFS, ...)${3:+: $3}"
  [[ "${4:-}" != reads ]] || need="with cluster.num_nodes=$NUM_NODES every node reads it: each node \
needs its own copy at this path, or put it on a filesystem every node mounts"
  [[ "$path" == /* ]] || die "$var=$path is not an absolute path: $need"
  dir="$path"
  while [[ ! -e "$dir" ]]; do dir="$(dirname "$dir")"; done
  if [[ "$dir" == / && "$path" != / ]]; then  # not even its top-level directory is here
    top="${path#/}"
    echo "$SCRIPT_NAME: warning: cannot tell from this node whether $var=$path is on a \
filesystem every node mounts (/${top%%/*} does not exist here)" >&2
    return 0
  fi
  fstype="$(stat -f -c %T "$dir" 2>/dev/null)" || return 0  # no GNU stat: cannot tell
  [[ "$NODE_LOCAL_FS" != *" $fstype "* ]] && return 0
  local problem="$var=$path is on a node-local filesystem ($fstype at $dir on this node): $need"
  [[ "${4:-}" == warn || "${4:-}" == reads ]] || die "$problem"
  echo "$SCRIPT_NAME: warning: $problem" >&2
}
if ((NUM_NODES > 1)); then
  for line in "${run_dirs[@]}"; do
    pair="${line#* }"
    if [[ "$line" == writes* ]]; then  # every node saves there
      check_shared "${pair%%=*}" "${pair#*=}"
    elif [[ -e "${pair#*=}" ]]; then  # a warning only: each node may hold a copy at the same path
      check_shared "${pair%%=*}" "${pair#*=}" "" reads
    fi  # (one not here is named where it is not mounted, below)
  done
  # a warning only: a checkout the container image holds at the same path on every node is fine
  if ((${#relative_dirs[@]})); then
    keys=" ${relative_dirs[*]} "
    why=""
    [[ "$keys" != *" checkpointing.checkpoint_dir "* ]] || why="each node would keep its own part of every checkpoint"
    [[ "$keys" != *" logger.log_dir "* ]] || why+="${why:+; }each node would keep its own logs"
    [[ "$keys" != *"_file "* ]] || why+="${why:+; }each node reads a file only where it has its own copy"
    verb=resolve
    ((${#relative_dirs[@]} > 1)) || verb=resolves
    check_shared NEMO_RL_DIR "$NEMO_RL_DIR" "the config's ${relative_dirs[*]} $verb under it, the job's \
working directory ($why)" warn
  fi
  [[ -n "${HF_HOME:-}${NRL_MEGATRON_CHECKPOINT_DIR:-}" ]] || die "cluster.num_nodes=$NUM_NODES: \
set HF_HOME (or NRL_MEGATRON_CHECKPOINT_DIR) to a directory on a filesystem every node mounts \
(e.g. HF_HOME=/lustre/\$USER/hf): NeMo-RL converts the model to Megatron format once, in \
\$NRL_MEGATRON_CHECKPOINT_DIR, else \$HF_HOME/nemo_rl, else ~/.cache/huggingface/nemo_rl, and \
every node reads it"
  for var in HF_HOME NRL_MEGATRON_CHECKPOINT_DIR; do
    [[ -z "${!var:-}" ]] || check_shared "$var"
  done
fi

# Slurm time limit (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) -> seconds; fails if malformed.
slurm_seconds() {
  local t="$1" d=0 rest h=0 m=0 s=0
  [[ "$t" =~ ^([0-9]+-[0-9]+(:[0-9]+){0,2}|[0-9]+(:[0-9]+){0,2})$ ]] || return 1
  if [[ "$t" == *-* ]]; then
    d="${t%%-*}"
    IFS=: read -r h m s <<< "${t#*-}"
  else
    IFS=: read -r rest m s <<< "$t"
    if [[ -z "$m" ]]; then m="$rest"; elif [[ -z "$s" ]]; then s="$m"; m="$rest"; else h="$rest"; fi
  fi
  echo $((10#$d * 86400 + 10#${h:-0} * 3600 + 10#${m:-0} * 60 + 10#${s:-0}))
}
# Seconds -> NeMo-RL's DD:HH:MM:SS (checkpoint_must_save_by, utils/timer.py convert_to_seconds).
dd_hh_mm_ss() { printf '%02d:%02d:%02d:%02d' $(($1 / 86400)) $(($1 % 86400 / 3600)) $(($1 % 3600 / 60)) $(($1 % 60)); }

# NeMo-RL's grpo_train saves a checkpoint and stops once checkpoint_must_save_by (from the
# start of training) is near; without it a job longer than TIME is killed between saves.
time_limit="${TIME:-04:00:00}"
margin="${SAVE_MARGIN:-20}"
save_by=()
if ((check)) && [[ "$cfg_checkpoints" == true && ! "${time_limit,,}" =~ ^(unlimited|infinite)$ ]]; then
  formats="(M, M:S, H:M:S, D-H, D-H:M, D-H:M:S)"
  limit_s="$(slurm_seconds "$time_limit")" || die "TIME=$time_limit is not a Slurm time limit $formats"
  margin_s="$(slurm_seconds "$margin")" || die "SAVE_MARGIN=$margin is not a Slurm time limit $formats"
  ((limit_s > margin_s)) || die "TIME=$time_limit leaves no time to train before \
SAVE_MARGIN=$margin (the save and the job's start-up): raise TIME or lower SAVE_MARGIN"
  deadline="$(dd_hh_mm_ss $((limit_s - margin_s)))"
  key=checkpointing.checkpoint_must_save_by
  if [[ "$cfg_save_by" == null ]]; then
    save_by=("$key=$deadline")
  else
    [[ "$cfg_save_by" =~ ^[0-9]+:[0-9]+:[0-9]+:[0-9]+$ ]] \
      || die "$key=$cfg_save_by is not NeMo-RL's DD:HH:MM:SS (e.g. $key=$deadline)"
    IFS=: read -r d h m s <<< "$cfg_save_by"
    ((10#$d * 86400 + 10#$h * 3600 + 10#$m * 60 + 10#$s <= limit_s)) || die "$key=$cfg_save_by \
is after the job's time limit TIME=$time_limit: the job is killed before it saves (expected at \
most $(dd_hh_mm_ss "$limit_s"), e.g. $key=$deadline, SAVE_MARGIN=$margin before it)"
  fi
fi

# `add_mount NAME PATH`: PATH into MOUNTS unless a mounted directory holds it, or stop naming NAME:
# ray.sub splits MOUNTS (and --container-workdir, NEMO_RL_DIR) at whitespace into srun's arguments,
# and pyxis splits MOUNTS at ',' and ':' and needs each source to exist.
mounted=()
add_mount() {
  local src
  for src in "${mounted[@]}"; do [[ "$2" != "$src" && "$2" != "$src"/* ]] || return 0; done
  [[ "$2" != *[[:space:],:]* ]] || die "$1=$2 cannot be mounted into the job's containers: ray.sub \
splits MOUNTS at whitespace and pyxis at ',' and ':' (expected a path without them)"
  [[ "$2" == /* ]] || die "$1=$2 is not an absolute path (a container mount needs one)"
  mounted+=("$2")
}
add_mount NEMO_RL_DIR "$NEMO_RL_DIR"
add_mount NEMO_AIS_DIR "$NEMO_AIS_DIR"
mkdirs=()  # the directories the job writes, created here where their filesystem is: a mount needs its source
# `create NAME DIR`: DIR into mkdirs unless it exists, or a warning when its top-level directory is not here
create() {
  local top="${2#/}"
  [[ ! -d "$2" ]] || return 0
  if [[ -d "/${top%%/*}" ]]; then mkdirs+=("$2"); return 0; fi
  echo "$SCRIPT_NAME: warning: $1=$2 is not created here (/${top%%/*} does not exist on this node): \
it must exist on the compute nodes before the job starts (a container mount needs its source)" >&2
}
for line in "${run_dirs[@]}"; do  # mounted: what the job writes outlives it, what it reads is there
  pair="${line#* }"
  key="${pair%%=*}"
  dir="${pair#*=}"
  if [[ "$line" == writes* ]]; then
    create "$key" "$dir"
  else  # a directory (a model, a checkpoint) or a file (a *_file or data_path): the directory it is in
    if [[ ! -d "$dir" && ( -e "$dir" || "$key" == *_file || "$key" == *.data_path ) ]]; then
      dir="$(dirname "$dir")"
      key="the directory of $key"
      [[ "$dir" != / ]] || die "${pair%%=*}=${pair#*=} is in /: mounting / would hide the container's own \
(expected a file in a directory of its own)"
    fi
    if [[ ! -d "$dir" ]]; then
      echo "$SCRIPT_NAME: warning: $pair is not on this node: not mounted (the job finds it only if the \
container image holds it; else add it to EXTRA_MOUNTS)" >&2
      continue
    fi
    # a Hugging Face cache snapshot's files link to ../../blobs: the model's whole cache entry
    [[ ! "$dir" =~ ^(.+/models--[^/]+)/snapshots/[^/]+$ ]] || dir="${BASH_REMATCH[1]}"
    [[ "$IMAGE_DIRS" != *" $dir "* ]] || echo "$SCRIPT_NAME: warning: $key=$dir: mounting it hides the \
container image's own $dir (put what the job reads in a directory of its own)" >&2
  fi
  add_mount "$key" "$dir"
done
add_mount "the config's directory" "$(dirname "$config")"
job_env=""
for var in HF_HOME NRL_MEGATRON_CHECKPOINT_DIR; do
  [[ -n "${!var:-}" ]] || continue
  add_mount "$var" "${!var}"
  create "$var" "${!var}"
  job_env+="export $var=$(shq "${!var}") && "
done
[[ "${EXTRA_MOUNTS:-}" != *[[:space:]]* ]] || die "EXTRA_MOUNTS=$EXTRA_MOUNTS holds whitespace: ray.sub \
splits MOUNTS there (expected src:dst[,src:dst ...] without it)"
mounts=""
for src in "${mounted[@]}"; do mounts+="${mounts:+,}$src:$src"; done
[[ -z "${EXTRA_MOUNTS:-}" ]] || mounts+=",$EXTRA_MOUNTS"

entry=(uv run python "$NEMO_AIS_DIR/launchers/run_grpo_ais.py" --config "$config" "${overrides[@]}"
  "${save_by[@]}")
# PYTHONPATH is joined in the job (the container's own value is only known there), by
# _pythonpath.sh: nemo_ais first, no empty entry.
command="${job_env}source $(shq "$NEMO_AIS_DIR/launchers/_pythonpath.sh") && \
export PYTHONPATH=\"\$(pythonpath_with $(shq "$NEMO_AIS_DIR"))\" && $(shq_words "${entry[@]}")"
job_name="${JOB_NAME:-nemo-ais-$(basename "$config" .yaml)}"

sbatch_cmd=(sbatch "--nodes=$NUM_NODES" "--account=$ACCOUNT" "--partition=$PARTITION"
  "--job-name=$job_name" "--time=$time_limit")
[[ -z "${GRES:-}" ]] || sbatch_cmd+=("--gres=$GRES")
if [[ -n "${SBATCH_ARGS:-}" ]]; then
  read -r -a extra <<< "$SBATCH_ARGS"
  for arg in "${extra[@]}"; do  # sbatch takes the last value: these would undo the deadline, the chain, the size
    [[ ! "$arg" =~ ^(--time|--job-name|--nodes)(=.*)?$ && ! "$arg" =~ ^-[tJN] ]] || die "SBATCH_ARGS: $arg is \
set by this script (use TIME=..., JOB_NAME=... or the config's cluster.num_nodes): TIME sets the save deadline \
checkpointing.checkpoint_must_save_by, JOB_NAME the --dependency=singleton chain of resumed jobs"
  done
  sbatch_cmd+=("${extra[@]}")
fi
sbatch_cmd+=("$NEMO_RL_DIR/ray.sub")
job_vars=(COMMAND CONTAINER MOUNTS GPUS_PER_NODE)
COMMAND="$command"
MOUNTS="$mounts"

if ((dry_run)); then
  printf 'cd %s\n' "$(shq "$NEMO_RL_DIR")"
  for var in "${job_vars[@]}"; do printf 'export %s=%s\n' "$var" "$(shq "${!var}")"; done
  ((${#mkdirs[@]} == 0)) || printf 'mkdir -p -- %s\n' "$(shq_words "${mkdirs[@]}")"
  printf '%s\n' "$(shq_words "${sbatch_cmd[@]}")"
  exit 0
fi
cd "$NEMO_RL_DIR"
export "${job_vars[@]}"
((${#mkdirs[@]} == 0)) || mkdir -p -- "${mkdirs[@]}" || die "cannot create ${mkdirs[*]} (the job mounts them)"
exec "${sbatch_cmd[@]}"
