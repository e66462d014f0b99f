# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Replay one logged step through the core: statistics, diagnostics, alpha, mode weights.

Per ``train_data_step{N}.jsonl`` (one global batch), with the core code only:

1. pass 1, per chunk of rows: :func:`~nemo_ais.core.compute_statistics` (the float64 sufficient-statistics vector,
   summed over chunks exactly as the all-reduce sums it over DP ranks), the :func:`~nemo_ais.core.correction_weights`
   of each mode needing no global-batch value (``tis``, ``icepop``, ``seq_mask_geo``), the refit guard's |l| profile;
2. :func:`~nemo_ais.core.diagnostics_from_stats` on the summed vector: R, D, CV^2, KL, ``token_mult_prob_error``, the
   gates and alpha (the EMA ``state`` is carried from step to step, as the AIS worker carries it);
3. pass 2, over the chunks kept from pass 1 (in memory up to a budget, then spilled to a temporary directory): the
   weights of the replayed modes that need a global-batch value (``ais``, with that alpha).

A mode's weight summary and what counts as capped or masked: docs/analyze.md.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nemo_ais.analyze.position import PositionProfile, position_profile
from nemo_ais.analyze.reader import BadInputError, Chunk, EmptyStepError, ReadCounts, StepFile, iter_chunks
from nemo_ais.config import CorrectionConfig, require_config
from nemo_ais.core import (
    AISDiagnostics,
    AISState,
    AISStats,
    compute_statistics,
    correction_weights,
    diagnostics_from_stats,
)
from nemo_ais.modes import MODES as ALL_MODES

# the modes whose record has a ``replay``, in the registry's order (tis, icepop, seq_mask_geo, ais)
MODES = tuple(name for name, mode in ALL_MODES.items() if mode.replay is not None)
_BYTES_PER_POSITION = 2 * 8 + 1  # two float64 log-probs and a bool mask


@dataclass
class WeightSums:
    """Running sums of one mode's weights over a step's valid tokens."""

    n_tok: int = 0
    w_sum: float = 0.0
    w_sq_sum: float = 0.0
    w_max: float = 0.0
    n_affected: int = 0

    def add(self, w_hat: torch.Tensor, valid: torch.Tensor, affected: torch.Tensor) -> None:
        """Add one chunk's weights (0 at masked positions)."""
        w = w_hat.to(torch.float64)
        self.n_tok += int(valid.sum())
        self.w_sum += float(w.sum())
        self.w_sq_sum += float(w.square().sum())
        if valid.any():
            self.w_max = max(self.w_max, float(w[valid].max()))
        self.n_affected += int(affected.sum())

    def summary(self) -> dict[str, float]:
        """mean, max, frac_capped_or_masked, ess (0 when every weight is 0)."""
        n = max(self.n_tok, 1)
        ess = self.w_sum**2 / (n * self.w_sq_sum) if self.w_sq_sum > 0 else 0.0
        return {
            "mean": self.w_sum / n,
            "max": self.w_max,
            "frac_capped_or_masked": self.n_affected / n,
            "ess": min(1.0, ess),
        }


@dataclass
class StepResult:
    """Everything the analysis knows about one step."""

    step: int
    path: Path
    diagnostics: AISDiagnostics
    weights: dict[str, dict[str, float]]
    counts: ReadCounts
    n_tok: int
    n_positions: int
    n_nonfinite: int = 0
    first_nonfinite: str = ""
    profile: PositionProfile = field(default_factory=PositionProfile.empty)
    n_filtered: int = 0


class _ChunkStore:
    """Chunks of pass 1 for pass 2: in memory up to ``budget_bytes``, then on disk."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget, self.used = budget_bytes, 0
        self.memory: list[Chunk] = []
        self.files: list[Path] = []
        self.tmp: Path | None = None

    def add(self, chunk: Chunk) -> None:
        size = chunk.num_positions * _BYTES_PER_POSITION
        if self.used + size <= self.budget:
            self.memory.append(chunk)
            self.used += size
            return
        if self.tmp is None:
            self.tmp = Path(tempfile.mkdtemp(prefix="nemo_ais_analyze_"))
        path = self.tmp / f"{len(self.files)}.pt"
        torch.save((chunk.logp_old, chunk.logp_rollout, chunk.valid), path)
        self.files.append(path)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        for c in self.memory:
            yield c.logp_old, c.logp_rollout, c.valid
        for path in self.files:
            yield torch.load(path, weights_only=True)

    def close(self) -> None:
        self.memory.clear()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def replay_step(
    step_file: StepFile,
    config: CorrectionConfig,
    state: AISState | None = None,
    *,
    chunk_tokens: int = 1 << 20,
    memory_budget_bytes: int = 128 << 20,
    skip_bad_rows: bool = False,
    on_bytes: Callable[[int], None] | None = None,
    kv_min_length: int = 256,
    filtered_sampling: bool = False,
) -> StepResult:
    """Steps 1-3 of the module docstring for one step file.

    Args:
        config: the ``loss_fn.ais`` section the diagnostics and weights use.
        state: AIS EMA state, advanced once (carry it across steps).
        chunk_tokens: positions per chunk (bounds the memory of pass 1).
        memory_budget_bytes: chunks kept in memory for pass 2; the rest is spilled.
        on_bytes: progress callback (bytes read).
        kv_min_length: shortest valid span of a sequence in the position profile.
        filtered_sampling: the run trained with top-k / top-p filtering (:func:`~nemo_ais.analyze.reader.iter_chunks`).

    Raises:
        BadInputError: a bad row (unless skipped), an empty file, or no row left to analyse (rows without a valid
            token are an empty global batch).
        TypeError: ``config`` is not a :class:`~nemo_ais.config.CorrectionConfig`.
    """
    require_config(config, CorrectionConfig, "replay_step(config)")
    counts = ReadCounts()
    modes = {m: config.model_copy(update={"mode": m}) for m in MODES}
    pass_1 = [m for m in MODES if not ALL_MODES[m].needs_alpha]  # the rest need the diagnostics
    sums = {m: WeightSums() for m in MODES}
    vector: torch.Tensor | None = None
    profile = PositionProfile.empty(kv_min_length)
    n_tok = n_positions = n_nonfinite = n_old_nonzero = n_filtered = 0
    first_nonfinite = ""
    store = _ChunkStore(memory_budget_bytes)

    def add(m: str, old, rollout, valid, **alpha: float) -> None:
        w_hat = correction_weights(old, rollout, valid, modes[m], **alpha)
        fn = ALL_MODES[m].replay.affected  # the tokens it masks or floors; None: none
        mask = fn(old, rollout, valid, modes[m], w_hat) if fn else torch.zeros_like(valid)
        sums[m].add(w_hat, valid, mask)

    try:
        for chunk in iter_chunks(  # step 1 (pass 1)
            step_file,
            chunk_tokens=chunk_tokens,
            skip_bad_rows=skip_bad_rows,
            counts=counts,
            on_bytes=on_bytes,
            filtered_sampling=filtered_sampling,
        ):
            old, rollout, valid = chunk.logp_old, chunk.logp_rollout, chunk.valid
            local = compute_statistics(old, rollout, valid, config).vector
            vector = local if vector is None else vector + local
            for m in pass_1:
                add(m, old, rollout, valid)
            profile = profile.merge(position_profile(old, rollout, valid, min_length=kv_min_length))
            n_tok += int(valid.sum())
            n_old_nonzero += int(torch.count_nonzero(old[valid]))
            n_positions += chunk.num_positions
            first_nonfinite = first_nonfinite or chunk.first_nonfinite
            n_nonfinite += chunk.n_nonfinite
            n_filtered += chunk.n_filtered
            store.add(chunk)
        if vector is None:  # rows with no valid token are an empty global batch, as the loss saw it (step 2)
            raise EmptyStepError(
                step_file.path, counts.lines, f"no row to analyse ({counts.bad_rows} bad rows skipped)"
            )
        # log pi_old = 0 (p = 1) at every finite valid token, top-k/top-p placeholders included: no trainer forward
        if n_tok + n_filtered and n_old_nonzero == 0:
            raise BadInputError(
                step_file.path,
                0,
                f"prev_logprobs is 0 at all {n_tok + n_filtered} valid tokens: NeMo-RL's placeholder when "
                "loss_fn.force_on_policy_ratio is on (loss_fn.ais.bypass sets it), which skips "
                "the trainer's log-probs; there is no rollout-training mismatch to replay",
            )
        diagnostics = diagnostics_from_stats(AISStats(vector), config, state)  # step 2
        pass_2 = [m for m in MODES if m not in pass_1]
        for old, rollout, valid in store:  # step 3 (pass 2)
            for m in pass_2:
                add(m, old, rollout, valid, alpha=getattr(diagnostics, ALL_MODES[m].batch_field))
    finally:
        store.close()
    weights = {m: s.summary() for m, s in sums.items()}
    for m in MODES:  # the share capped at C is core's frac_capped (rho > C)
        frac_capped = ALL_MODES[m].replay.frac_capped
        if frac_capped is not None:
            weights[m]["frac_capped_or_masked"] += frac_capped(diagnostics)
    return StepResult(
        step=step_file.step,
        path=step_file.path,
        diagnostics=diagnostics,
        weights=weights,
        counts=counts,
        n_tok=n_tok,
        n_positions=n_positions,
        n_nonfinite=n_nonfinite,
        first_nonfinite=first_nonfinite,
        profile=profile,
        n_filtered=n_filtered,
    )
