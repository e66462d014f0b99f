# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The error-token metric (QaRL's repetitive, garbled tokens) on hand-worked responses."""

from __future__ import annotations

import pytest
import torch

from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm
from nemo_ais.embedded.error_tokens import ErrorTokenCounts, error_token_counts, repeat_flags, response_alphabet
from nemo_ais.embedded.tokenizer import CharTokenizer
from nemo_ais.embedded.warmstart import build_task

TOK = CharTokenizer()
DIGITS_AND_COMMA = frozenset(TOK.stoi[c] for c in "0123456789,")


def _row(text: str, *, eos: bool, width: int = 10) -> tuple[list[int], list[float]]:
    ids = TOK.encode(text, eos=eos)
    return ids + [TOK.pad_id] * (width - len(ids)), [1.0] * len(ids) + [0.0] * (width - len(ids))


def test_repeat_flags_by_hand():
    # "aaaa": 3-grams end at t=2 (new) and t=3 (the same "aaa": a repeat)
    assert repeat_flags([5, 5, 5, 5]) == [False, False, False, True]
    # "ab,ab": no 3-gram twice; 2-grams "ab" at t=1 and t=4
    assert repeat_flags([1, 2, 0, 1, 2]) == [False] * 5
    assert repeat_flags([1, 2, 0, 1, 2], n=2) == [False, False, False, False, True]
    assert repeat_flags([]) == []


def test_error_token_counts_by_hand():
    rows = [
        # "12,12,12<eos>": 8 content tokens; 3-grams (t=2..7) "12," "2,1" ",12" are new,
        # then "12," "2,1" ",12" again at t=5, 6, 7: 3 repeats; no invalid token
        _row("12,12,12", eos=True),
        # "7=7=7" truncated (no <eos>): 5 content tokens; "=" at t=1, 3 is invalid;
        # 3-grams "7=7" (t=2, new), "=7=" (t=3, new), "7=7" (t=4, repeat): 1 repeat;
        # error = invalid or repeat: t=1, 3, 4 -> 3
        _row("7=7=7", eos=False),
        # "<eos>" alone: no content
        _row("", eos=True),
        # "5<eos>" then padding: 1 content token, no error
        _row("5", eos=True),
    ]
    ids = torch.tensor([r[0] for r in rows])
    mask = torch.tensor([r[1] for r in rows])
    counts = error_token_counts(ids, mask, DIGITS_AND_COMMA, eos_id=TOK.eos_id)
    # content 8 + 5 + 0 + 1 = 14; repeat 3 + 1 = 4; invalid 2; error 3 + 3 = 6
    assert counts == ErrorTokenCounts(14.0, 4.0, 2.0, 6.0)
    assert counts.rates() == {
        "error_tokens/repeat_frac": 4 / 14,
        "error_tokens/invalid_frac": 2 / 14,
        "error_tokens/error_frac": 6 / 14,
    }


def test_masked_tokens_and_empty_batches_do_not_count():
    ids = torch.tensor([TOK.encode("1+1", eos=False)])
    mask = torch.tensor([[1.0, 0.0, 0.0]])  # only "1" is a valid token
    assert error_token_counts(ids, mask, DIGITS_AND_COMMA, eos_id=TOK.eos_id) == (1, 0, 0, 0)
    empty = error_token_counts(torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 4), DIGITS_AND_COMMA, eos_id=2)
    assert empty == (0, 0, 0, 0) and set(empty.rates().values()) == {0.0}
    with pytest.raises(ValueError, match="response_ids: got"):
        error_token_counts(ids, mask[:, :2], DIGITS_AND_COMMA, eos_id=2)


@pytest.mark.parametrize(("preset", "chars"), [("default.yaml", "0123456789,"), ("quick.yaml", "0123456789")])
def test_response_alphabet_is_digits_and_the_answers_separators(preset, chars):
    task = build_task(resolve_arm(load_config(CONFIG_DIR / preset), None))
    assert response_alphabet(task) == frozenset(TOK.stoi[c] for c in chars)
