# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Task, tokenizer and advantages of the embedded recipe against hand-worked values."""

import pytest
import torch

from nemo_ais.embedded.rollout import chunk_range, group_advantages
from nemo_ais.embedded.task import AdditionTask, ChainTask, seeded_generator
from nemo_ais.embedded.tokenizer import CharTokenizer


def _resp(task, texts, width=None, eos=True):
    tok = task.tokenizer
    rows = [tok.encode(t, eos=eos) for t in texts]
    width = width or max(len(r) for r in rows)
    return torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in rows])


def test_tokenizer_round_trip_and_errors():
    tok = CharTokenizer()
    ids = tok.encode("12+34=", bos=True, eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == "12+34="
    assert tok.decode([*tok.encode("7"), tok.eos_id, *tok.encode("9")]) == "7"
    assert tok.vocab_size % 8 == 0 and tok.vocab_size >= 15
    with pytest.raises(ValueError, match="not in"):
        tok.encode("1*2")


def test_problems_are_seeded_and_eval_is_held_out():
    task = AdditionTask(num_digits=2, eval_size=200, eval_seed=7)
    assert len(set(task.eval_problems)) == 200
    assert all(10 <= a < 100 and 10 <= b < 100 for a, b in task.eval_problems)
    a = task.sample_train(500, seeded_generator("prompts", 0, 3))
    b = task.sample_train(500, seeded_generator("prompts", 0, 3))
    c = task.sample_train(500, seeded_generator("prompts", 0, 4))
    assert a == b and a != c
    assert not set(a) & set(task.eval_problems)
    assert AdditionTask(2, 200, 7).eval_problems == task.eval_problems


def test_prompt_and_sft_layout():
    task = AdditionTask(num_digits=2, eval_size=4, eval_seed=0, reverse_answer=True)
    tok = task.tokenizer
    ids = task.prompt_ids([(23, 58)])
    assert ids.shape == (1, task.prompt_len) and tok.decode(ids[0]) == "23+58="
    assert task.answer((23, 58)) == "18"  # 81 reversed
    inp, lab = task.sft_batch([(23, 58)])
    assert tok.decode(inp[0]) == "23+58=18"
    assert lab[0, : task.prompt_len].eq(-100).all()
    assert lab[0, task.prompt_len : task.prompt_len + 3].tolist() == tok.encode("18", eos=True)


def test_rewards_hand_worked():
    task = AdditionTask(num_digits=2, eval_size=1, eval_seed=0)
    p = [(23, 58)] * 5  # answer "81"
    resp = _resp(task, ["81", "87", "810", "18", "1"], width=4)
    # positional matches / max(len): 2/2, 1/2, 2/3, 0/2, 0/2
    expected = torch.tensor([1.0, 0.5, 2 / 3, 0.0, 0.0])
    torch.testing.assert_close(task.rewards(p, resp), expected)
    torch.testing.assert_close(task.correct(p, resp), torch.tensor([1.0, 0, 0, 0, 0]))
    torch.testing.assert_close(task.rewards(p, resp, kind="exact"), task.correct(p, resp))
    no_eos = _resp(task, ["81"], eos=False)
    assert task.rewards(p[:1], no_eos).item() == 0.0 and task.correct(p[:1], no_eos).item() == 0
    with pytest.raises(ValueError, match=r"response_ids: got \(5,\)"):
        task.rewards(p, resp[:, 0])


def test_group_advantages_against_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    adv = group_advantages(r, 4, normalize=True, leave_one_out=False, eps=0.0)
    # group 1: mean 0.25, unbiased std sqrt(0.75/3) = 0.5 -> (0.75, -0.25 x3) / 0.5
    torch.testing.assert_close(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]))
    assert adv[4:].eq(0).all()  # zero-std group: exactly 0, no division by zero
    raw = group_advantages(r, 4, normalize=False, leave_one_out=True, eps=1e-6)
    # leave-one-out baseline: mean of the other three
    torch.testing.assert_close(raw[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    with pytest.raises(ValueError, match="multiple of num_generations=3"):
        group_advantages(r, 3, normalize=True, leave_one_out=False, eps=1e-6)


def test_chunk_ownership_covers_every_chunk_once():
    owned = [c for rank in range(4) for c in chunk_range(8, rank, 4)]
    assert owned == list(range(8))
    with pytest.raises(ValueError, match=r"cluster\.dp_size=3"):
        chunk_range(8, 0, 3)


def test_chain_task_hand_worked():
    task = ChainTask(num_digits=2, eval_size=8, eval_seed=0, chain_length=4)
    # 37 + k * 85 mod 100: 22, 07, 92, 77 (fixed width, leading zero kept)
    assert task.chain((37, 85)) == [22, 7, 92, 77]
    assert task.prompt((3, 85)) == "03+85=" and task.answer((37, 85)) == "22,07,92,77"
    # 11 characters, <eos>, and room for one stray token
    assert task.prompt_len == 7 and task.max_response_len == 13 == len("22,07,92,77") + 2
    rev = ChainTask(num_digits=2, eval_size=8, eval_seed=0, chain_length=4, reverse_answer=True)
    assert rev.answer((37, 85)) == "22,70,29,77"  # every value least-significant digit first
    assert rev.alt_answer((37, 85)) == "22,70,29,77="
    inp, lab = rev.sft_batch([(37, 85), (37, 85)], alt=[False, True])
    assert rev.tokenizer.decode(inp[0]) == "37+85=22,70,29,77"
    assert rev.tokenizer.decode(inp[1]) == "37+85=22,70,29,77="
    assert (lab[:, rev.prompt_len :] != -100).sum(dim=1).tolist() == [12, 13]
    assert all(0 <= a < 100 and 0 <= b < 100 for a, b in task.eval_problems)


def test_chain_rewards_prefix_digits_exact():
    task = ChainTask(num_digits=2, eval_size=1, eval_seed=0, chain_length=3)
    p = [(37, 85)] * 6  # answer "22,07,92"
    texts = ["22,07,92", "22,08,92", "22,07", "22,07,92,77", "22,07,92=", "23,07,92"]
    resp = _resp(task, texts)
    # prefix: leading values right / max(#values): 3/3, 1/3 (the right 92 after a mistake
    # earns nothing), 2/3, 3/4, 2/3 (the stray "=" spoils the last value), 0
    torch.testing.assert_close(
        task.rewards(p, resp, kind="prefix"), torch.tensor([1.0, 1 / 3, 2 / 3, 3 / 4, 2 / 3, 0.0])
    )
    # digits: positional characters / max(len): 8/8, 7/8, 5/8, 8/11, 8/9, 7/8
    torch.testing.assert_close(
        task.rewards(p, resp, kind="digits"), torch.tensor([1.0, 7 / 8, 5 / 8, 8 / 11, 8 / 9, 7 / 8])
    )
    torch.testing.assert_close(task.rewards(p, resp, kind="exact"), torch.tensor([1.0, 0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"data\.reward='bogus'"):
        task.rewards(p, resp, kind="bogus")
    with pytest.raises(ValueError, match=r"data\.chain_length=0"):
        ChainTask(num_digits=2, eval_size=1, eval_seed=0, chain_length=0)


def test_chain_steps_reward_credits_each_step_from_the_written_value():
    task = ChainTask(num_digits=2, eval_size=1, eval_seed=0, chain_length=3)
    p = (37, 85)  # s = 37, d = 85; answer "22,07,92"
    texts = ["22,07,92", "22,08,93", "23,08,93", "22,07", "22,0,92", "22,07,92=", "22,07,92,77"]
    resp = _resp(task, texts)
    # 08 = 07 + 85 is wrong but 93 = 08 + 85 is right from what was written: 2/3;
    # "23" wrong, then 08 = 23 + 85 and 93 right: 2/3; two of three: 2/3; "0" unreadable
    # fails its step and the next: 1/3; "92=" unreadable: 2/3; a 4th value: 3/4
    expected = torch.tensor([1.0, 2 / 3, 2 / 3, 2 / 3, 1 / 3, 2 / 3, 3 / 4])
    torch.testing.assert_close(task.rewards([p] * len(texts), resp, kind="steps"), expected)
    rev = ChainTask(num_digits=2, eval_size=1, eval_seed=0, chain_length=2, reverse_answer=True)
    torch.testing.assert_close(  # reversed digits: 22, 70 (= 07)
        rev.rewards([p, p], _resp(rev, ["22,70", "22,07"]), kind="steps"), torch.tensor([1.0, 0.5])
    )
    add = AdditionTask(num_digits=2, eval_size=1, eval_seed=0)
    with pytest.raises(ValueError, match=r"data\.reward='steps' is invalid for AdditionTask"):
        add.rewards([(23, 58)], _resp(add, ["81"]), kind="steps")


def test_a_special_token_before_eos_is_a_wrong_character():
    # decode drops <pad>/<bos>; scored, they must not turn a garbled response exact
    task = ChainTask(num_digits=2, eval_size=1, eval_seed=0, chain_length=3)
    tok = task.tokenizer
    p = [(37, 85)] * 3  # answer "22,07,92"
    right = tok.encode("22,07,92")
    rows = [[*right[:1], tok.pad_id, *right[1:]], [*right[:3], tok.bos_id, *right[3:]], [*right, tok.pad_id]]
    resp = torch.tensor([[*r, tok.eos_id] for r in rows])
    assert tok.decode(resp[0]) == "22,07,92"  # for display: dropped, as before
    torch.testing.assert_close(task.correct(p, resp), torch.zeros(3))
    torch.testing.assert_close(task.rewards(p, resp, kind="exact"), torch.zeros(3))
    # steps: the value holding the stray token is unreadable (fails its step and the next);
    # a stray token after the last value spoils that value
    torch.testing.assert_close(task.rewards(p, resp, kind="steps"), torch.tensor([1 / 3, 1 / 3, 2 / 3]))
    # digits: positional matches / max(len): the shift after the stray token costs the rest
    torch.testing.assert_close(task.rewards(p, resp, kind="digits"), torch.tensor([1 / 9, 3 / 9, 8 / 9]))
    assert task.chains_right(p, resp).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(("chain_length", "tokens"), [(11, 33), (33, 99), (64, 192)])
def test_chain_length_sets_the_response_length(chain_length, tokens):
    # chain_length values of 2 digits, chain_length - 1 commas and <eos>: L * (2 + 1) tokens
    task = ChainTask(num_digits=2, eval_size=4, eval_seed=0, chain_length=chain_length)
    p = task.eval_problems[0]
    assert len(task.tokenizer.encode(task.answer(p), eos=True)) == tokens
    _, labels = task.sft_batch([p])
    assert int((labels != -100).sum()) == tokens
    assert task.max_response_len == tokens + 1  # room for the stray "=" of alt_answer


def test_fp4_long_preset_writes_99_token_responses():
    from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm
    from nemo_ais.embedded.task import task_from_config

    raw = load_config(CONFIG_DIR / "fp4-long.yaml")
    cfg = resolve_arm(raw, "nvfp4_w4a4-none")
    task = task_from_config(cfg.data)
    assert (cfg.data.task, cfg.data.chain_length) == ("chain", 33)
    assert len(task.tokenizer.encode(task.answer(task.eval_problems[0]), eos=True)) >= 99
    assert (cfg.precision.format, cfg.precision.kv_cache) == ("nvfp4_w4a4", "nvfp4")
    with pytest.raises(ValueError, match=r"data\.chain_length=65 is invalid"):
        load_config(CONFIG_DIR / "fp4-long.yaml", ["data.chain_length=65"])


@pytest.mark.nemo_rl
@pytest.mark.parametrize("leave_one_out", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_group_advantages_are_nemo_rls_estimator(leave_one_out, normalize):
    """Upstream's own GRPO advantage estimator on the same groups (LOO: the others' mean and std)."""
    from nemo_rl.algorithms.advantage_estimator import GRPOAdvantageEstimator

    g = torch.Generator().manual_seed(3)
    groups = [torch.randint(0, 3, (6,), generator=g) / 2 for _ in range(8)]
    groups += [torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.5]), torch.full((6,), 0.5)]  # a lone success; no spread
    rewards = torch.cat(groups)
    prompts = torch.arange(len(groups)).repeat_interleave(6)[:, None]

    class Config(dict):  # v0.7.0 reads the estimator config by key, main by attribute
        __getattr__ = dict.__getitem__

    estimator = GRPOAdvantageEstimator(
        Config(normalize_rewards=normalize, use_leave_one_out_baseline=leave_one_out), {}
    )
    upstream = estimator.compute_advantage(prompts, rewards, torch.ones(len(rewards), 1))[:, 0]
    ours = group_advantages(rewards, 6, normalize=normalize, leave_one_out=leave_one_out, eps=1e-6)
    torch.testing.assert_close(ours, upstream.float(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("group", "g"),
    [([1 / 20, 1.0], 2), ([2 / 3] + [1 / 10] * 7, 8), ([0.05, 1.0, 1.0], 3), ([0.0, 1 / 3, 1 / 3, 1 / 3], 4)],
)
def test_leave_one_out_spread_of_tied_others_is_exactly_zero(group, g):
    """The others' std from the others themselves: tied others (or G = 2) give 0, so A = r - b, never a 1e6 blow-up."""
    import statistics

    want = []
    for i, r in enumerate(group):
        others = group[:i] + group[i + 1 :]
        b, s = statistics.fmean(others), (statistics.stdev(others) if len(others) > 1 else 0.0)
        want.append((r - b) / (s + 1e-6) if s > 0 else r - b)
    got = group_advantages(torch.tensor(group), g, normalize=True, leave_one_out=True, eps=1e-6)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), rtol=1e-6, atol=1e-6)
