# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Error tokens of the sampled responses: QaRL's "repetitive, garbled" tokens, counted.

**[reconstruction]** QaRL (arXiv 2604.07853) gives no formula; ours, on the content of a response (its valid tokens
before the first ``<eos>``):

* repeat: token ``t`` completes an n-gram (``n =`` :data:`NGRAM` ``= 3``, one chain value plus its separator) seen
  earlier in the same response; overlapping n-grams count;
* invalid: the token is not in the task's response alphabet (:func:`response_alphabet`);
* error: repeat or invalid.

Each rate is a token fraction over the step's global batch, ``error_tokens/<kind>_frac = Σ_i #{t : kind(i, t)} /
Σ_i L_i`` (0 when ``Σ_i L_i = 0``). A correct chain may repeat a 3-gram by itself: compare arms, not the level.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch

from nemo_ais.embedded.stats import ERROR_TOKEN_KEYS
from nemo_ais.embedded.task import ArithmeticTask

NGRAM = 3  # n of the repeated n-gram: a 2-digit chain value and its separator


class ErrorTokenCounts(NamedTuple):
    """Token counts of one batch (floats, so ranks can sum them): content, repeat, invalid, error."""

    n_content: float
    n_repeat: float
    n_invalid: float
    n_error: float

    def rates(self) -> dict[str, float]:
        """``{"error_tokens/<kind>_frac": count / n_content}``; all 0 for no content."""
        n = self.n_content
        return {f"error_tokens/{k}": (c / n if n else 0.0) for k, c in zip(ERROR_TOKEN_KEYS, self[1:], strict=True)}


def response_alphabet(task: ArithmeticTask) -> frozenset[int]:
    """Σ: token ids of the ten digits and of every character of the held-out answers."""
    tok = task.tokenizer
    chars = set("0123456789").union(*(task.answer(p) for p in task.eval_problems))
    return frozenset(tok.stoi[c] for c in chars)


def repeat_flags(tokens: list[int], n: int = NGRAM) -> list[bool]:
    """Per token: does it complete an n-gram already completed earlier in ``tokens``?"""
    first = max(n - 1, 0)  # the first token that can complete an n-gram
    seen: set[tuple[int, ...]] = set()
    flags = [False] * min(first, len(tokens))
    for t in range(first, len(tokens)):
        gram = tuple(tokens[t + 1 - n : t + 1])
        flags.append(gram in seen)
        seen.add(gram)
    return flags


def error_token_counts(
    response_ids: torch.Tensor, mask: torch.Tensor, alphabet: Iterable[int], *, eos_id: int, n: int = NGRAM
) -> ErrorTokenCounts:
    """Repeat / invalid / error counts of ``[B, T]`` responses (module doc); zeros when empty.

    ``mask`` marks the valid tokens up to ``<eos>``, which ends the content; ``alphabet`` is
    :func:`response_alphabet`'s. Raises ``ValueError`` for shapes that differ or are not 2-D.
    """
    if response_ids.dim() != 2 or mask.shape != response_ids.shape:
        raise ValueError(
            f"response_ids: got {list(response_ids.shape)}, expected a [B, T] tensor like mask {list(mask.shape)}"
        )
    valid = frozenset(alphabet)
    n_content = n_repeat = n_invalid = n_error = 0
    for ids, m in zip(response_ids.tolist(), mask.tolist(), strict=True):
        content = [y for y, keep in zip(ids, m, strict=True) if keep]
        if eos_id in content:
            content = content[: content.index(eos_id)]
        repeat = repeat_flags(content, n)
        invalid = [y not in valid for y in content]
        n_content += len(content)
        n_repeat += sum(repeat)
        n_invalid += sum(invalid)
        n_error += sum(r or v for r, v in zip(repeat, invalid, strict=True))
    return ErrorTokenCounts(float(n_content), float(n_repeat), float(n_invalid), float(n_error))
