# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""GRPO with a quantized rollout engine and the AIS correction, on one CPU machine.

Torchtune-style: ``build_*(cfg)`` builders, called in order by :meth:`GRPORecipe.setup`; :meth:`GRPORecipe.train` is
one visible loop::

    rollout (twin, synced) -> trainer log-probs -> group advantages
      -> per global batch: AIS statistics -> ONE all-reduce -> diagnostics
      -> per micro-batch: core clipped loss (nemo_ais.core.clipped_pg_loss) -> backward
      -> gradient all-reduce (SUM) -> optimizer step -> log -> checkpoint

No loss math here: the surrogate and every correction weight are :func:`nemo_ais.core.clipped_pg_loss`'s, the code the
NeMo-RL adapter runs. Each gloo rank trains on its chunks; the loss is normalised by the GLOBAL valid-token count, so
the ranks' gradients are summed.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nemo_ais.core import AISDiagnostics, AISState, clipped_pg_loss, compute_diagnostics
from nemo_ais.embedded.aligned import RolloutAlignedPolicy
from nemo_ais.embedded.checkpoint import (
    UnreadableFileError,
    checkpoint_path,
    checkpoint_remedy,
    error_cause,
    load_checkpoint,
    save_checkpoint,
)
from nemo_ais.embedded.config import RecipeConfig
from nemo_ais.embedded.dist import DistContext, RecipeError, all_reduce_sum
from nemo_ais.embedded.error_tokens import ErrorTokenCounts, error_token_counts, response_alphabet
from nemo_ais.embedded.logs import METRICS_FILE, MetricsFile, log_readback, log_train_data
from nemo_ais.embedded.model import response_logprobs
from nemo_ais.embedded.rollout import RolloutBatch, chunk_range, generate_rollouts, group_advantages
from nemo_ais.embedded.task import ArithmeticTask, seeded_generator
from nemo_ais.embedded.warmstart import build_task, build_untrained_policy, greedy_responses, load_warm_start
from nemo_ais.modes import MODES
from nemo_ais.rollout.twin import Fp8Twin


class NonFiniteError(RecipeError):
    """A loss, gradient or parameter became NaN/inf during training."""


def build_policy(cfg: RecipeConfig, task: ArithmeticTask, warm_start_file: Path | None):
    """The fp32 Qwen2 policy: random init, then the warm-start weights if given."""
    policy = build_untrained_policy(cfg, task)
    if warm_start_file is not None:
        policy.load_state_dict(load_warm_start(warm_start_file))
    return policy.train()


def build_optimizer(cfg: RecipeConfig, policy: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW of ``policy.optimizer`` (the GRPO optimizer; a fresh one per run)."""
    opt = cfg.policy.optimizer
    return torch.optim.AdamW(
        policy.parameters(), lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay
    )


def build_rollout_engine(cfg: RecipeConfig, policy: torch.nn.Module) -> Fp8Twin:
    """The simulated rollout engine (``rollout.format`` / ``kv_cache``; bf16 + bf16 = BF16 arm)."""
    return Fp8Twin(policy, cfg.precision)


def build_trainer_forward(cfg: RecipeConfig, policy: torch.nn.Module, engine: Fp8Twin) -> torch.nn.Module:
    """The module of the trainer's log-probs: ``policy``, or (QaRL) its rollout-aligned view."""
    if not cfg.policy.rollout_aligned_quantization:
        return policy
    return RolloutAlignedPolicy(policy, engine)


@dataclass
class StepStats:
    """What one GRPO step's optimisation reports (global values, identical on all ranks)."""

    loss: float
    grad_norm: float
    core: dict[str, float]
    diagnostics: dict[str, float]
    ess_tok: float  # AISDiagnostics.ess_tok of the global batch


class GRPORecipe:
    """One (arm, seed) GRPO run on one DP rank (``warm_start_file`` None: random init)."""

    def __init__(
        self,
        cfg: RecipeConfig,
        *,
        arm: str,
        seed: int,
        ctx: DistContext,
        run_dir: Path,
        warm_start_file: Path | None,
        progress: Any = None,
    ) -> None:
        self.cfg, self.arm, self.seed, self.ctx = cfg, arm, seed, ctx
        self.run_dir = Path(run_dir)
        self.warm_start_file = warm_start_file
        self.progress = progress
        self.metrics = MetricsFile(self.run_dir / METRICS_FILE) if ctx.is_main else None
        self.ckpt_path = checkpoint_path(self.run_dir, arm, seed)

    def setup(self) -> None:
        """Build everything; the order of the calls matters where commented."""
        cfg = self.cfg
        # the task first: its tokenizer fixes the model's vocabulary and lengths
        self.task = build_task(cfg)
        self.policy = build_policy(cfg, self.task, self.warm_start_file)
        self.optimizer = build_optimizer(cfg, self.policy)
        # the twin deep-copies the final policy's modules (re-synced before every rollout)
        self.engine = build_rollout_engine(cfg, self.policy)
        # the aligned forward (QaRL) quantizes the twin's modules with the twin's calibration
        self.trainer_forward = build_trainer_forward(cfg, self.policy, self.engine)
        self.alphabet = response_alphabet(self.task)  # error tokens: valid response tokens
        self.ais_state = AISState()
        # last: the checkpoint restores policy, optimizer, AIS state and RNG in place
        self.start_step, self.finished = self._load_checkpoint()
        self.num_chunks = cfg.grpo.num_prompts_per_step // cfg.rollout.prompts_per_chunk
        self.my_chunks = chunk_range(self.num_chunks, self.ctx.rank, self.ctx.world_size)

    def train(self) -> None:
        """The GRPO loop: rollout -> logprobs -> advantages -> core loss -> step -> log -> ckpt."""
        cfg = self.cfg
        if self.finished:
            return
        if self.start_step == 0:
            self._evaluate(0)
        for step in range(self.start_step + 1, cfg.grpo.max_num_steps + 1):
            t0 = time.perf_counter()
            batch = self._rollout(step)  # 1. sync the engine, sample this rank's chunks
            t1 = time.perf_counter()
            if cfg.correction.bypass:  # 2. pi_old := mu: no trainer forward, no entropy
                logp_old, entropy = batch.logp_rollout, None
            else:
                logp_old, entropy = self._logprobs(batch.sequences, grad=False)  # 2. pi_old
            t2 = time.perf_counter()
            adv = group_advantages(  # 3. group-normalised advantages (groups are local)
                batch.rewards,
                cfg.grpo.num_generations_per_prompt,
                normalize=cfg.grpo.normalize_rewards,
                leave_one_out=cfg.grpo.use_leave_one_out_baseline,
                eps=cfg.grpo.advantage_std_eps,
            )
            stats = []
            for idx in self._minibatches(len(batch)):  # one optimizer step per global batch
                diag = self._diagnostics(step, logp_old[idx], batch, idx)  # ONE all-reduce
                core = self._accumulate_gradients(batch, idx, logp_old, adv, diag)  # 4.
                grad_norm = self._optimizer_step(step)  # 5. grad all-reduce, clip, step
                stats.append(StepStats(core.pop("loss"), grad_norm, core, diag.as_dict(), diag.ess_tok))
            t3 = time.perf_counter()
            times = {"rollout": t1 - t0, "logprobs": t2 - t1, "train": t3 - t2, "step": t3 - t0}
            self._log(step, batch, entropy, stats, times)  # 6.
            self._log_train_data(step, batch, logp_old, adv)  # 6b. NeMo-RL-layout batch log
            last = step == cfg.grpo.max_num_steps
            if last or (cfg.grpo.val_period and step % cfg.grpo.val_period == 0):
                self._evaluate(step)
            self._save_checkpoint(step)  # 7.
            if self.progress is not None:
                self.progress.update(1)

    def _rollout(self, step: int) -> RolloutBatch:
        cfg = self.cfg
        problems = self.task.sample_train(cfg.grpo.num_prompts_per_step, seeded_generator("prompts", self.seed, step))
        # Refit: every rank re-quantizes the same weights and calibrates any KV scales on the step's GLOBAL prompts.
        self.engine.sync_weights(self.policy.state_dict(), calibration_input_ids=self.task.prompt_ids(problems))
        return generate_rollouts(
            self.engine,
            self.task,
            problems,
            self.my_chunks,
            prompts_per_chunk=cfg.rollout.prompts_per_chunk,
            num_generations=cfg.grpo.num_generations_per_prompt,
            seed=self.seed,
            step=step,
            temperature=cfg.rollout.temperature,
            top_k=cfg.rollout.top_k,
            top_p=cfg.rollout.top_p,
            reward=cfg.data.reward,
        )

    def _logprobs(self, sequences: torch.Tensor, *, grad: bool):
        """Trainer log-probs of the response tokens, in micro-batches (no grad: ``(logp, H)``)."""
        mbs = self.cfg.policy.train_micro_batch_size
        args = (self.task.prompt_len, self.cfg.rollout.temperature)
        with torch.set_grad_enabled(grad):
            parts = [
                response_logprobs(self.trainer_forward, mb, *args, return_entropy=not grad)
                for mb in sequences.split(mbs)
            ]
        if grad:
            return torch.cat(parts)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _minibatches(self, n_local: int) -> list[torch.Tensor]:
        """Local sample indices of each global batch: the k-th slice of every local chunk (independent of dp_size)."""
        k_total = self.cfg.rollout_batch_size // self.cfg.train_global_batch_size
        chunk = self.cfg.rollout.prompts_per_chunk * self.cfg.grpo.num_generations_per_prompt
        per = chunk // k_total
        starts = range(0, n_local, chunk)
        return [torch.cat([torch.arange(s + k * per, s + (k + 1) * per) for s in starts]) for k in range(k_total)]

    def _diagnostics(self, step, logp_old, batch: RolloutBatch, idx) -> AISDiagnostics:
        """AIS diagnostics of one global batch: local statistics -> ONE all-reduce -> alpha."""
        try:
            return compute_diagnostics(
                logp_old,
                batch.logp_rollout[idx],
                batch.mask[idx],
                self.cfg.correction,
                group=self.ctx.group,
                state=self.ais_state,
            )
        except ValueError as err:  # raised on every rank alike (from reduced values)
            raise NonFiniteError(self._where(step, f"bad log-probs in the rollout batch: {err}")) from None

    def _accumulate_gradients(self, batch, idx, logp_old, adv, diag) -> dict[str, float]:
        """Core clipped loss on each micro-batch of this rank's share; gradients accumulate."""
        cfg = self.cfg
        self.optimizer.zero_grad(set_to_none=False)
        sums: dict[str, torch.Tensor] = {}
        for mb in idx.split(cfg.policy.train_micro_batch_size):
            logp_theta = self._logprobs(batch.sequences[mb], grad=True)
            out = clipped_pg_loss(
                logp_theta,
                logp_old[mb],
                batch.logp_rollout[mb],
                adv[mb],
                batch.mask[mb],
                cfg.correction,
                pg=cfg.pg,
                diagnostics=diag,
                global_valid_tokens=diag.n_tok,
                global_valid_seqs=diag.n_seq,
                rewards=batch.rewards[mb],  # loss_fn.positive_example_nll_weight (VAPO)
            )
            out.loss.backward()
            for key in ("loss", "probs_ratio", "probs_ratio_clamped", "sampling_importance_ratio"):
                sums[key] = sums.get(key, 0.0) + out.metrics[key].detach().double()
        # the per-micro-batch metrics are already normalised by GLOBAL counts: sum over ranks
        keys = sorted(sums)
        vec = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64) for k in keys])
        all_reduce_sum(vec, self.ctx)
        return dict(zip(keys, vec.tolist(), strict=True))

    def _optimizer_step(self, step: int) -> float:
        """SUM the gradients over ranks (one all-reduce), clip, check finite, AdamW step."""
        params = [p for p in self.policy.parameters() if p.requires_grad]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        all_reduce_sum(flat, self.ctx)
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(g.view_as(p))
        max_norm = self.cfg.policy.max_grad_norm
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else math.inf))
        if not math.isfinite(grad_norm):
            raise NonFiniteError(self._where(step, f"non-finite gradient norm ({grad_norm})"))
        self.optimizer.step()
        norm = float(torch.stack([p.detach().norm() for p in params]).norm())
        if not math.isfinite(norm):
            raise NonFiniteError(self._where(step, "non-finite parameters after the optimizer step"))
        return grad_norm

    def _log(self, step, batch: RolloutBatch, entropy, stats: list[StepStats], times) -> None:
        """One ``train`` record per step (rank 0); rollout statistics are summed over ranks."""
        lengths = batch.mask.sum(dim=1)
        errors = error_token_counts(
            batch.sequences[:, self.task.prompt_len :], batch.mask, self.alphabet, eos_id=self.task.tokenizer.eos_id
        )
        vec = torch.tensor(
            [
                float(batch.rewards.sum()),
                float(batch.correct.sum()),
                float(len(batch)),
                float(lengths.sum()),
                0.0 if entropy is None else float((entropy.double() * batch.mask).sum()),
                *errors,
            ],
            dtype=torch.float64,
        )
        all_reduce_sum(vec, self.ctx)
        reward_sum, correct_sum, n, len_sum, entropy_sum, *error_sums = vec.tolist()
        loss = sum(s.loss for s in stats) / len(stats)
        if not math.isfinite(loss):
            raise NonFiniteError(self._where(step, f"non-finite loss ({loss})"))
        if self.metrics is None:
            return
        mean = lambda key, src: sum(getattr(s, src)[key] for s in stats) / len(stats)  # noqa: E731
        applied_alpha = MODES[self.cfg.correction.mode].applied_alpha  # ais: the diagnostics' alpha
        record = {
            "kind": "train",
            "arm": self.arm,
            "seed": self.seed,
            "step": step,
            "reward": reward_sum / n,
            "accuracy": correct_sum / n,  # fraction of rollout samples exactly right
            "response_length": len_sum / n,
            # mean per-token entropy (nats) of the trainer on the responses (bypass: NaN)
            "entropy": math.nan if entropy is None else entropy_sum / len_sum if len_sum else 0.0,
            # QaRL's error tokens: repeated 3-grams / off-alphabet tokens per content token
            **ErrorTokenCounts(*error_sums).rates(),
            "loss": loss,
            "grad_norm": sum(s.grad_norm for s in stats) / len(stats),
            # position between uncorrected (0) and fully weighted (1) gradient actually used
            "alpha": sum(applied_alpha(s.diagnostics) for s in stats) / len(stats),
            "probs_ratio": mean("probs_ratio", "core"),
            "sampling_importance_ratio": mean("sampling_importance_ratio", "core"),
            **{f"ais/{k}": mean(k, "diagnostics") for k in stats[0].diagnostics},
            # token ESS ratio of the truncated token weights: (sum w)^2 / (n sum w^2)
            "ess_tok": statistics.fmean(s.ess_tok for s in stats),
            **{f"time/{k}": v for k, v in times.items()},
        }
        self.metrics.write(record)
        if self.progress is not None:
            self.progress.set_postfix(arm=self.arm, seed=self.seed, reward=f"{record['reward']:.2f}")

    def _log_train_data(self, step, batch: RolloutBatch, logp_old, adv) -> None:
        """The step's batch as NeMo-RL's ``train_data_step{N}.jsonl`` + refit readback (rank 0)."""
        log_dir = self.run_dir / "logs" / f"{self.arm}_seed{self.seed}"
        log_train_data(self.ctx, self.task, log_dir, step, batch, logp_old, adv)
        log_readback(self.ctx, log_dir, step, self.engine.readback)

    @torch.no_grad()
    def _evaluate(self, step: int) -> None:
        """Held-out greedy accuracy of the TRAINER policy (eval set split over ranks)."""
        t0 = time.perf_counter()
        problems = self.task.eval_problems
        per = -(-len(problems) // self.ctx.world_size)
        mine = problems[self.ctx.rank * per : (self.ctx.rank + 1) * per]
        correct, reward = 0.0, 0.0
        if mine:
            responses = greedy_responses(self.policy, self.task, mine)
            correct = float(self.task.correct(mine, responses).sum())
            reward = float(self.task.rewards(mine, responses, kind=self.cfg.data.reward).sum())
        vec = all_reduce_sum(torch.tensor([correct, reward], dtype=torch.float64), self.ctx)
        if self.metrics is not None:
            self.metrics.write(
                {
                    "kind": "val",
                    "arm": self.arm,
                    "seed": self.seed,
                    "step": step,
                    "accuracy": float(vec[0]) / len(problems),
                    "reward": float(vec[1]) / len(problems),
                    "num_problems": len(problems),
                    "time/eval": time.perf_counter() - t0,
                }
            )

    def _save_checkpoint(self, step: int) -> None:
        cfg = self.cfg
        last = step == cfg.grpo.max_num_steps
        due = last or step % cfg.checkpointing.save_period == 0
        if not (self.ctx.is_main and cfg.checkpointing.enabled and due):
            return
        save_checkpoint(
            self.ckpt_path,
            step=step,
            finished=last,
            policy=self.policy,
            optimizer=self.optimizer,
            ais_state=self.ais_state.state_dict(),
            extra={"arm": self.arm, "seed": self.seed},
        )

    def _load_checkpoint(self) -> tuple[int, bool]:
        blob = load_checkpoint(self.ckpt_path) if self.cfg.checkpointing.enabled else None
        if blob is None:
            if self.metrics is not None:
                self.metrics.truncate_run(self.arm, self.seed, -1)
            return 0, False
        try:  # a readable checkpoint whose contents do not fit this run (other model, ...)
            self.policy.load_state_dict(blob["policy"])
            self.optimizer.load_state_dict(blob["optimizer"])
            self.ais_state.load_state_dict(blob["ais_state"])
            torch.set_rng_state(blob["torch_rng_state"])
        except Exception as err:
            raise UnreadableFileError(
                f"checkpoint {self.ckpt_path} does not fit this run ({error_cause(err)}); "
                f"{checkpoint_remedy(self.ckpt_path)}"
            ) from None
        step = int(blob["step"])
        if self.metrics is not None:
            self.metrics.truncate_run(self.arm, self.seed, step)
        if self.progress is not None:
            self.progress.update(step)
        return step, bool(blob["finished"])

    def _where(self, step: int, what: str) -> str:
        return (
            f"{what} at step {step} (arm {self.arm}, seed {self.seed}); metrics up to the last completed step are in "
            f"{self.run_dir / METRICS_FILE}. Lower policy.optimizer.lr (now {self.cfg.policy.optimizer.lr}) or set "
            "policy.max_grad_norm."
        )
