# Copyright (c) 2026, nemo_ais contributors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Verifiable arithmetic task: ``a+b=`` with ``num_digits``-digit operands, reward = exact match.

Prompt ``<bos>123+456=``, expected response ``579<eos>`` (``975<eos>`` with ``reverse_answer``). Problems are drawn from counter-based
generators (:func:`seeded_generator`), so the problems of step ``s`` depend only on
``(seed, s)`` -- never on how many processes draw them or on what ran before (resume-exact).
The held-out evaluation set is fixed by ``eval_seed`` and excluded from training draws.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from nemo_ais.embedded.tokenizer import CharTokenizer

__all__ = ["AdditionTask", "Problem", "seeded_generator"]

Problem = tuple[int, int]


def seeded_generator(*key: int | str) -> torch.Generator:
    """A CPU generator seeded by a stable hash of ``key`` (e.g. ``("rollout", seed, step, chunk)``)."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


@dataclass
class AdditionTask:
    """Addition of two ``num_digits``-digit numbers (leading digit non-zero).

    Args:
        num_digits: digits per operand (>= 1).
        eval_size: size of the held-out evaluation set.
        eval_seed: seed of the evaluation set.
        reverse_answer: write the sum least-significant digit first (``23+58=`` -> ``18``),
            which a small transformer learns much faster (each digit then depends only on
            already-written ones and the aligned operand digits).
        tokenizer: the character tokenizer.
    """

    num_digits: int
    eval_size: int
    eval_seed: int
    reverse_answer: bool = False
    tokenizer: CharTokenizer = field(default_factory=CharTokenizer)

    def __post_init__(self) -> None:
        if self.num_digits < 1:
            raise ValueError(f"data.num_digits={self.num_digits} is invalid: expected >= 1")
        lo, hi = self._range()
        if self.eval_size < 0 or self.eval_size > (hi - lo) ** 2 // 2:
            raise ValueError(
                f"data.eval_size={self.eval_size} is invalid: expected 0..{(hi - lo) ** 2 // 2} "
                f"for num_digits={self.num_digits}"
            )
        self.eval_problems: list[Problem] = self._draw(
            self.eval_size, seeded_generator("eval", self.eval_seed), exclude=set(), unique=True
        )
        self._eval_set = set(self.eval_problems)

    @property
    def prompt_len(self) -> int:
        """Tokens per prompt: ``<bos>``, two operands, ``+`` and ``=``."""
        return 2 * self.num_digits + 3

    @property
    def max_response_len(self) -> int:
        """Longest correct response: ``num_digits + 1`` digits and ``<eos>``."""
        return self.num_digits + 2

    def _range(self) -> tuple[int, int]:
        return 10 ** (self.num_digits - 1) if self.num_digits > 1 else 0, 10**self.num_digits

    def _draw(
        self, n: int, gen: torch.Generator, exclude: set[Problem], unique: bool = False
    ) -> list[Problem]:
        lo, hi = self._range()
        out: list[Problem] = []
        seen: set[Problem] = set()
        while len(out) < n:
            ab = torch.randint(lo, hi, (2 * (n - len(out)), 2), generator=gen).tolist()
            for a, b in ab:
                p = (a, b)
                if p in exclude or (unique and p in seen):
                    continue
                seen.add(p)
                out.append(p)
                if len(out) == n:
                    break
        return out

    def sample_train(self, n: int, gen: torch.Generator) -> list[Problem]:
        """``n`` training problems drawn with ``gen``; the evaluation problems never appear."""
        return self._draw(n, gen, exclude=self._eval_set)

    def prompt(self, p: Problem) -> str:
        """The prompt text ``a+b=``."""
        return f"{p[0]}+{p[1]}="

    def answer(self, p: Problem) -> str:
        """The expected response text: ``str(a + b)``, reversed if ``reverse_answer``."""
        text = str(p[0] + p[1])
        return text[::-1] if self.reverse_answer else text

    def prompt_ids(self, problems: list[Problem]) -> torch.Tensor:
        """Token ids ``[n, prompt_len]`` int64 (every prompt has the same length; no padding)."""
        rows = [self.tokenizer.encode(self.prompt(p), bos=True) for p in problems]
        return torch.tensor(rows, dtype=torch.long).reshape(len(problems), self.prompt_len)

    def sft_batch(self, problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forcing batch for the warm start.

        Returns:
            input_ids ``[n, prompt_len + max_response_len]`` int64 (right-padded with pad_id) and
            labels of the same shape: the response tokens (answer and ``<eos>``), -100 elsewhere.
        """
        tok = self.tokenizer
        width = self.prompt_len + self.max_response_len
        ids = torch.full((len(problems), width), tok.pad_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        for i, p in enumerate(problems):
            prompt = tok.encode(self.prompt(p), bos=True)
            resp = tok.encode(self.answer(p), eos=True)
            ids[i, : len(prompt) + len(resp)] = torch.tensor(prompt + resp)
            labels[i, len(prompt) : len(prompt) + len(resp)] = torch.tensor(resp)
        return ids, labels

    def _texts(self, problems: list[Problem], response_ids: torch.Tensor) -> list[str | None]:
        """Decoded responses up to the first ``<eos>`` (None if the response has no ``<eos>``)."""
        if response_ids.ndim != 2 or response_ids.shape[0] != len(problems):
            raise ValueError(
                f"response_ids: got {tuple(response_ids.shape)}, expected [{len(problems)}, T]"
            )
        eos = self.tokenizer.eos_id
        out: list[str | None] = []
        for row in response_ids.tolist():
            if eos in row:
                out.append(self.tokenizer.decode(row[: row.index(eos)], stop_at_eos=False))
            else:
                out.append(None)
        return out

    def correct(self, problems: list[Problem], response_ids: torch.Tensor) -> torch.Tensor:
        """Exact match ``[n]`` float32 in {0, 1}: the response up to ``<eos>`` is the answer.

        A response without ``<eos>`` (truncated) is wrong.
        """
        texts = self._texts(problems, response_ids)
        return torch.tensor(
            [float(t == self.answer(p)) for p, t in zip(problems, texts, strict=True)],
            dtype=torch.float32,
        )

    def rewards(
        self, problems: list[Problem], response_ids: torch.Tensor, kind: str = "digits"
    ) -> torch.Tensor:
        """Programmatic reward ``[n]`` float32 in [0, 1].

        ``kind="exact"``: :meth:`correct`. ``kind="digits"`` (dense partial credit): the
        number of positions where the response character equals the answer character,
        divided by ``max(len(response), len(answer))``; 1 iff exact, 0 without ``<eos>``.
        E.g. answer ``"18"``: ``"18"`` -> 1, ``"17"`` -> 0.5, ``"180"`` -> 2/3.
        """
        if kind == "exact":
            return self.correct(problems, response_ids)
        if kind != "digits":
            raise ValueError(f"data.reward={kind!r} is invalid: expected 'digits' or 'exact'")
        texts = self._texts(problems, response_ids)
        out = torch.zeros(len(problems), dtype=torch.float32)
        for i, (p, text) in enumerate(zip(problems, texts, strict=True)):
            if not text:
                continue
            ans = self.answer(p)
            hits = sum(a == b for a, b in zip(text, ans, strict=False))
            out[i] = hits / max(len(text), len(ans))
        return out
