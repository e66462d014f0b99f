#!/usr/bin/env bash
# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
#
# Every GPU test and GPU benchmark of the project in one call, under 5 minutes on one
# H100 / H200 (torch 2.11 + its Triton, no vLLM / TE, no network):
#
#   1. pytest -m gpu                               (~2 min: Triton JIT of each kernel variant)
#   2. benchmarks.bench_refit_scale                (Qwen3-8B TP1 / Qwen3-30B-A3B TP2 refits)
#   3. benchmarks.bench_quant_gpu                  (per weight; Inductor compiles bf16 only)
#
# Each step has its own time limit (120 + 100 + 80 s), so a slow step cannot take the others'
# results with it, and the benchmarks record each row as it is measured;
# the logs, the junit XML and docs/benchmarks.md (rewritten by the benchmarks) land in $OUT
# (default: /tmp/gpu_checks_out). Exit status: the first failing step's.
#
# The machine needs nemo_ais's base dependencies (pydantic, omegaconf, ...). Where they
# are missing and nothing can be downloaded, carry wheels: on a machine with network,
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 -d .gpu_wheels pydantic==2.12.5 pydantic-core==2.41.5 \
#       annotated-types typing-inspection omegaconf==2.3.0
#   pip wheel --no-deps -w .gpu_wheels antlr4-python3-runtime==4.9.3   # sdist only on PyPI
# and the script installs them from .gpu_wheels (offline) before it starts (what ran on the
# H200 on 2026-11-28). No NeMo-RL there: pytest runs with --nemo-rl none (-m gpu only).
#
#   bash benchmarks/gpu_checks.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_checks_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
start=$SECONDS
status=0

step() {  # step NAME LIMIT_S CMD...: run CMD with a time limit, log to $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s, at $((SECONDS - start))s)"
  timeout --signal=INT --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - start))s"
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

if ! "$PY" -c "import pydantic, omegaconf" 2>/dev/null && [ -d .gpu_wheels ]; then
  "$PY" -m pip install -q --no-index --find-links .gpu_wheels pydantic omegaconf
fi
"$PY" - <<'EOF' | tee "$OUT/environment.txt"
import platform, torch, triton
print(f"{torch.cuda.get_device_name()}; Python {platform.python_version()}, torch "
      f"{torch.__version__}, Triton {triton.__version__}, CUDA {torch.version.cuda}")
EOF

step pytest_gpu 120 "$PY" -m pytest -m gpu tests/gpu tests/unit/test_fp8_stream.py --nemo-rl none -q -p no:cacheprovider \
  --junitxml="$OUT/pytest_gpu.xml"
step bench_refit_scale 100 "$PY" -m benchmarks.bench_refit_scale --repeats 3
step bench_quant_gpu 80 "$PY" -m benchmarks.bench_quant_gpu --repeats 10 \
  --compile-dtypes bfloat16 --compile-shapes 14336x4096
cp docs/benchmarks.md "$OUT/benchmarks.md"
echo "== all steps: $((SECONDS - start))s, exit $status"
exit "$status"
