# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Refit readback: after a refit, what the engine holds against what a correct refit gives.

The refit bugs peers shipped (a scale grid read in the wrong layout, a layer kept in BF16 that the trainer treats as
quantized, KV-cache scales no longer recalibrated) change neither the shapes nor the dtypes the engine loads, and on a
small batch their effect on the mismatch can sit inside its step-to-step noise (issue 27; docs/benchmarks.md
``alarm_calibration``). Reading the engine back finds each of them exactly, at the refit they happen:

* **weights**: every quantized linear's effective weight (the dequantized codes the forward multiplies by) against the
  format's quantization of the weight the trainer sent (or the dequantization of the FP8 codes and scales it sent),
  relative to the weight's amax;
* **KV-cache scales**: the scales the engine holds against those a calibration of the current weights on the refit's
  calibration batch gives, relative.

Both are exactly 0.0 on a healthy refit (the engine's own quantizer and calibration, rerun on the same input, give the
same bits), so any value above 0 is a refit bug, with no threshold to calibrate (``alarms.readback_tol``, default 0, is
for an engine whose readback goes through another kernel). The twin runs it when ``rollout.quantizer.verify_refit`` is
true; the embedded recipe writes one :data:`READBACK_FILE` row per refit beside NeMo-RL's step logs, from which
``nemo-ais analyze`` raises ``refit_readback`` (docs/analyze.md; a vLLM engine is not read back yet).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from nemo_ais.formats.fp8_block import dequantize_blockwise
from nemo_ais.refit.kv_scales import KVScales
from nemo_ais.rollout.linear import QuantExperts, QuantLinear

READBACK_FILE = "refit_readback.jsonl"
"""One JSON row per refit (``step`` and the :class:`RefitReadback` fields), in a log dir."""

_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class RefitReadback:
    """The readback of one refit: worst relative errors (0.0: exact; None: not checked)."""

    weight_error: float | None
    weight_module: str | None
    kv_scale_error: float | None
    weights_checked: int

    @property
    def exact(self) -> bool:
        """Whether every checked tensor read back exactly."""
        return not (self.weight_error or self.kv_scale_error)


def _relative(held: torch.Tensor, expected: torch.Tensor) -> float:
    if held.shape != expected.shape:
        return math.inf
    if torch.equal(held, expected):  # the healthy case, without float64 copies
        return 0.0
    diff = (held.to(torch.float64) - expected.to(torch.float64)).abs().max()
    return float(diff / expected.to(torch.float64).abs().max().clamp_min(_TINY))


def _linears(name: str, module: nn.Module, weights: Mapping[str, torch.Tensor]):
    """(name, linear, weight the trainer sent or None, its FP8 scale or None) of one module."""
    if isinstance(module, QuantExperts):
        for param in ("gate_up_proj", "down_proj"):
            stack = weights.get(f"{name}.{param}")
            for e, linear in enumerate(getattr(module, param)):
                yield f"{name}.{param}[{e}]", linear, None if stack is None else stack[e], None
        return
    yield name, module, weights.get(f"{name}.weight"), weights.get(f"{name}.weight_scale_inv")


@torch.no_grad()
def weight_readback(
    model: nn.Module, names: tuple[str, ...], weights: Mapping[str, torch.Tensor]
) -> tuple[float | None, str | None, int]:
    """Worst relative error of the quantized linears this refit sent: (error, module, count).

    ``error`` is None when no quantized weight was sent, ``module`` None when it is 0.0.
    """
    worst, where, count = None, None, 0
    for name in names:
        for label, linear, sent, scale in _linears(name, model.get_submodule(name), weights):
            if sent is None or not isinstance(linear, QuantLinear):
                continue
            if sent.dtype == torch.float8_e4m3fn:
                if scale is None:
                    continue
                expected = dequantize_blockwise(sent, scale, linear.weight_block, torch.float32, name=label)
            else:
                expected = linear.expected_weight(sent, linear.weight_amax)
            error = _relative(linear.weight_dequant, expected)
            count += 1
            if error > (worst or 0.0):
                where = label
            worst = max(worst or 0.0, error)
    return worst, where, count


def kv_scale_readback(held: KVScales | None, expected: KVScales) -> float:
    """Worst relative difference of the K / V scales the engine holds (inf: none held)."""
    if held is None:
        return math.inf
    return _relative(held.scale[:, 1:], expected.scale[:, 1:])


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _typed(row: dict) -> bool:
    """The :class:`RefitReadback` field types: errors float or None, module str or None, an int count."""
    errors = (row["weight_error"], row["kv_scale_error"])
    return (
        all(e is None or (isinstance(e, int | float) and not isinstance(e, bool)) for e in errors)
        and (row["weight_module"] is None or isinstance(row["weight_module"], str))
        and _is_int(row["weights_checked"])
    )


def read_readback(path: Path) -> tuple[dict[int, RefitReadback], list[tuple[int, str]]]:
    """``({step: RefitReadback}, [(line, problem)])`` of a :data:`READBACK_FILE` (empty if none).

    A row that is not a JSON object with an int ``step`` and the :class:`RefitReadback` fields of their types is
    returned as a problem (the caller names the file and line).
    """
    path = Path(path)
    if not path.is_file():
        return {}, []
    rows: dict[int, RefitReadback] = {}
    problems: list[tuple[int, str]] = []
    fields = RefitReadback.__dataclass_fields__
    for i, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        if not raw.strip():
            continue
        line = raw.decode(errors="replace")  # shown in the problem; parsed strictly below
        try:
            row = json.loads(raw.decode())  # a byte that is not UTF-8: UnicodeDecodeError, a ValueError
            step = row.pop("step")
            if not _is_int(step) or set(row) != set(fields) or not _typed(row):
                raise TypeError
            rows[step] = RefitReadback(**row)
        except (ValueError, TypeError, KeyError, AttributeError):
            expected = f"expected a JSON object with an int step and {', '.join(fields)}"
            problems.append((i, f"{expected}, got {line[:80]!r}"))
    return rows, problems


def readback_row(step: int, readback: RefitReadback) -> str:
    """One :data:`READBACK_FILE` line."""
    return json.dumps({"step": step, **asdict(readback)})
