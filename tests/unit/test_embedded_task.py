# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Task, tokenizer and advantages of the embedded recipe against hand-worked values."""

import pytest
import torch

from nemo_ais.embedded.rollout import chunk_range, group_advantages
from nemo_ais.embedded.task import AdditionTask, seeded_generator
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
