# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Recipe internals: micro-batch accumulation == one full-batch core loss; batch layout."""

import pytest
import torch
from embedded_recipes import tiny_recipe

from nemo_ais.core import compute_diagnostics
from nemo_ais.embedded.rollout import group_advantages


def _recipe(tmp_path, *extra, arm="fp8-ais"):
    return tiny_recipe(tmp_path, *extra, arm=arm)


def test_micro_batches_accumulate_to_the_full_batch_core_loss(tmp_path):
    torch.manual_seed(0)
    r = _recipe(tmp_path, "policy.train_micro_batch_size=5")  # 16 samples: 5 + 5 + 5 + 1
    batch = r._rollout(step=1)
    logp_old, _ = r._logprobs(batch.sequences, grad=False)
    # random advantages so every sample carries gradient (rewards of an untrained policy are ~0)
    adv = torch.randn(len(batch))
    idx = torch.arange(len(batch))
    diag = r._diagnostics(1, logp_old, batch, idx)
    r._accumulate_gradients(batch, idx, logp_old, adv, diag)
    got = [p.grad.clone() for p in r.policy.parameters()]

    # oracle: the same core loss on the whole batch at once (its own token count)
    from nemo_ais.core import clipped_pg_loss

    r.policy.zero_grad()
    logp = r._logprobs(batch.sequences, grad=True)
    full = clipped_pg_loss(
        logp,
        logp_old,
        batch.logp_rollout,
        adv,
        batch.mask,
        r.cfg.correction,
        pg=r.cfg.pg,
        diagnostics=compute_diagnostics(logp_old, batch.logp_rollout, batch.mask, r.cfg.correction),
    )
    full.loss.backward()
    for g, p in zip(got, r.policy.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-7)
    assert diag.n_tok == float(batch.mask.sum()) and 0.0 < diag.alpha < 1.0


def test_minibatches_take_the_kth_slice_of_every_chunk(tmp_path):
    r = _recipe(tmp_path, "policy.train_global_batch_size=4")  # 16 samples -> 4 optimizer steps
    parts = r._minibatches(16)
    # chunks of 2 prompts x 4 samples = 8 samples; each global batch: 2 from each chunk
    assert [p.tolist() for p in parts] == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]


def test_bf16_engine_reproduces_trainer_logprobs(tmp_path):
    r = _recipe(tmp_path, arm="bf16")
    batch = r._rollout(step=1)
    logp_old, _ = r._logprobs(batch.sequences, grad=False)
    m = batch.mask.bool()
    # same weights, fp32; only KV-cached decode vs full forward rounding differs
    torch.testing.assert_close(logp_old[m], batch.logp_rollout[m], rtol=0, atol=1e-5)
    fp8 = _recipe(tmp_path, arm="fp8-none")._rollout(step=1)
    assert torch.equal(fp8.sequences[:, : r.task.prompt_len], batch.sequences[:, : r.task.prompt_len])


@pytest.mark.parametrize("normalize", [True, False])
def test_advantages_are_zero_mean_per_group(normalize):
    rewards = torch.rand(32, generator=torch.Generator().manual_seed(1))
    adv = group_advantages(rewards, 8, normalize=normalize, leave_one_out=False, eps=1e-6)
    torch.testing.assert_close(adv.view(4, 8).sum(1), torch.zeros(4), atol=1e-5, rtol=0)


def test_positive_example_nll_term_reaches_the_recipe_gradient(tmp_path):
    """loss_fn.positive_example_nll_weight (VAPO): the recipe hands core the rollout rewards.

    One micro-batch (NeMo-RL normalises the NLL term by the call's own count): the recipe's
    gradient equals core's on the whole batch with the same rewards, and differs from the
    gradient without the term.
    """
    from nemo_ais.core import clipped_pg_loss

    torch.manual_seed(0)
    r = _recipe(tmp_path, "policy.train_micro_batch_size=16", "loss_fn.positive_example_nll_weight=0.5")
    batch = r._rollout(step=1)
    batch.rewards[::2] = 1.0  # half the samples positive: the NLL term is active
    logp_old, _ = r._logprobs(batch.sequences, grad=False)
    adv, idx = torch.randn(len(batch)), torch.arange(len(batch))
    diag = r._diagnostics(1, logp_old, batch, idx)
    r._accumulate_gradients(batch, idx, logp_old, adv, diag)
    got = [p.grad.clone() for p in r.policy.parameters()]

    def core_grads(rewards, pg):
        r.policy.zero_grad()
        logp = r._logprobs(batch.sequences, grad=True)
        clipped_pg_loss(
            logp, logp_old, batch.logp_rollout, adv, batch.mask, r.cfg.correction, pg=pg,
            diagnostics=diag, rewards=rewards,
        ).loss.backward()  # fmt: skip
        return [p.grad.clone() for p in r.policy.parameters()]

    for g, want in zip(got, core_grads(batch.rewards, r.cfg.pg), strict=True):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-7)
    without = core_grads(None, r.cfg.pg.model_copy(update={"positive_example_nll_weight": 0.0}))
    assert any(not torch.allclose(g, w, atol=1e-6) for g, w in zip(got, without, strict=True))


def test_tbpo_with_a_token_surrogate_option_is_a_config_error(tmp_path):
    with pytest.raises(ValueError, match=r"loss_fn\.use_cispo=True is invalid with loss_fn\.ais\.mode='tbpo'"):
        _recipe(tmp_path, "loss_fn.ais.mode=tbpo", "loss_fn.use_cispo=true")
