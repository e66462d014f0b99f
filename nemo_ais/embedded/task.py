# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Verifiable arithmetic tasks of the embedded recipe; reward and accuracy by program.

:class:`ChainTask` (``data.task: chain``, the default) answers ``s+d=`` with running sums, so one wrong digit makes
every later value wrong::

    37+85=22,07,92,77,62,47,32,17,02,87,72<eos>      (reverse_answer=False)

:class:`AdditionTask` (``addition``): ``a+b=`` -> ``str(a + b)``. ``reverse_answer`` writes every number lowest digit
first. The problems of step ``s`` depend only on ``(seed, s)`` (:func:`seeded_generator`), never on the process count or
on what ran before; training draws exclude the held-out set (``eval_seed``). See docs/embedded.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from nemo_ais.embedded.tokenizer import CharTokenizer

Problem = tuple[int, int]


def seeded_generator(*key: int | str) -> torch.Generator:
    """A CPU generator seeded by a stable hash of ``key`` (e.g. ``("rollout", seed, step, chunk)``)."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


@dataclass
class ArithmeticTask:
    """A problem ``(a, b)`` of two ``num_digits``-digit integers, prompt ``a+b=``.

    Subclasses define :meth:`answer`, :meth:`_range` and :attr:`max_response_len`; drawing,
    tokenisation, teacher-forcing batches, exact match and the rewards are shared.
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
        """Longest correct response in tokens, ``<eos>`` included."""
        raise NotImplementedError

    def _range(self) -> tuple[int, int]:
        """Operands are drawn uniformly from ``[lo, hi)``."""
        raise NotImplementedError

    def answer(self, p: Problem) -> str:
        """The expected response text (without ``<eos>``)."""
        raise NotImplementedError

    def _number(self, value: int, width: int | None = None) -> str:
        text = str(value) if width is None else f"{value:0{width}d}"
        return text[::-1] if self.reverse_answer else text

    def _draw(self, n: int, gen: torch.Generator, exclude: set[Problem], unique: bool = False) -> list[Problem]:
        lo, hi = self._range()
        out: list[Problem] = []
        seen: set[Problem] = set()
        while len(out) < n:
            ab = torch.randint(lo, hi, (2 * (n - len(out)), 2), generator=gen).tolist()
            for p in map(tuple, ab):
                if len(out) < n and p not in exclude and not (unique and p in seen):
                    seen.add(p)
                    out.append(p)
        return out

    def sample_train(self, n: int, gen: torch.Generator) -> list[Problem]:
        """``n`` training problems drawn with ``gen``; the evaluation problems never appear."""
        return self._draw(n, gen, exclude=self._eval_set)

    def prompt(self, p: Problem) -> str:
        """The prompt text ``a+b=``."""
        return f"{p[0]}+{p[1]}="

    def prompt_ids(self, problems: list[Problem]) -> torch.Tensor:
        """Token ids ``[n, prompt_len]`` int64 (every prompt has the same length; no padding)."""
        rows = [self.tokenizer.encode(self.prompt(p), bos=True) for p in problems]
        return torch.tensor(rows, dtype=torch.long).reshape(len(problems), self.prompt_len)

    def alt_answer(self, p: Problem) -> str:
        """The answer in the task's alternative notation (wrong for the verifier)."""
        raise NotImplementedError(f"{type(self).__name__} has no alternative notation")

    def sft_batch(self, problems: list[Problem], alt: list[bool] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forcing batch for the warm start: ``(input_ids, labels)``.

        ``alt[i]`` writes demonstration ``i`` in :meth:`alt_answer`'s notation. Both are ``[n, prompt_len +
        max_response_len]`` int64, right-padded; labels hold the response tokens (answer and ``<eos>``), -100 elsewhere.
        """
        tok = self.tokenizer
        width = self.prompt_len + self.max_response_len
        ids = torch.full((len(problems), width), tok.pad_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        alt = alt or [False] * len(problems)
        for i, (p, use_alt) in enumerate(zip(problems, alt, strict=True)):
            prompt = tok.encode(self.prompt(p), bos=True)
            resp = tok.encode(self.alt_answer(p) if use_alt else self.answer(p), eos=True)
            ids[i, : len(prompt) + len(resp)] = torch.tensor(prompt + resp)
            labels[i, len(prompt) : len(prompt) + len(resp)] = torch.tensor(resp)
        return ids, labels

    def _texts(self, problems: list[Problem], response_ids: torch.Tensor) -> list[str | None]:
        """Decoded responses up to the first ``<eos>`` (None: none); a special or unused id before it reads as U+FFFD.

        U+FFFD is in no answer: such a response is not exact, and the partial rewards count it as a wrong character.
        """
        if response_ids.ndim != 2 or response_ids.shape[0] != len(problems):
            raise ValueError(f"response_ids: got {tuple(response_ids.shape)}, expected [{len(problems)}, T]")
        eos, decode = self.tokenizer.eos_id, self.tokenizer.decode
        rows = response_ids.tolist()
        return [decode(r[: r.index(eos)], stop_at_eos=False, unknown="\ufffd") if eos in r else None for r in rows]

    def chains_right(self, problems: list[Problem], response_ids: torch.Tensor) -> torch.Tensor:
        """``[n]`` float32 in {0, 1}: the response is :meth:`answer` or :meth:`alt_answer`.

        What the warm start is judged by: the arithmetic, not the terminator (a near-tie rounding can flip).
        """
        texts = self._texts(problems, response_ids)
        out = []
        for p, text in zip(problems, texts, strict=True):
            try:
                forms = (self.answer(p), self.alt_answer(p))
            except NotImplementedError:
                forms = (self.answer(p),)
            out.append(float(text in forms))
        return torch.tensor(out, dtype=torch.float32)

    def correct(self, problems: list[Problem], response_ids: torch.Tensor) -> torch.Tensor:
        """Exact match ``[n]`` float32 in {0, 1} of the response up to ``<eos>`` (none: wrong)."""
        texts = self._texts(problems, response_ids)
        return torch.tensor(
            [float(t == self.answer(p)) for p, t in zip(problems, texts, strict=True)], dtype=torch.float32
        )

    def rewards(self, problems: list[Problem], response_ids: torch.Tensor, kind: str = "digits") -> torch.Tensor:
        """Programmatic reward ``[n]`` float32 in [0, 1]; every kind is 1 iff exact, 0 without ``<eos>``.

        ``exact``: :meth:`correct`. ``digits``: positions where the response character equals the answer's /
        ``max(len(response), len(answer))`` (``"18"``: ``"17"`` -> 0.5, ``"180"`` -> 2/3). ``prefix``: leading steps
        (:meth:`_steps`: chain values, else characters) equal to the answer's / ``max(steps in response, steps in
        answer)`` (``"22,70,29"``: ``"22,71,29"`` -> 1/3). ``steps`` (chain): :meth:`ChainTask._step_credit`.
        """
        if kind == "exact":
            return self.correct(problems, response_ids)
        if kind not in ("digits", "prefix", "steps"):
            raise ValueError(f"data.reward={kind!r} is invalid: expected 'steps', 'prefix', 'digits' or 'exact'")
        texts = self._texts(problems, response_ids)
        out = torch.zeros(len(problems), dtype=torch.float32)
        for i, (p, text) in enumerate(zip(problems, texts, strict=True)):
            if not text:
                continue
            ans = self.answer(p)
            if kind == "steps":
                out[i] = self._step_credit(p, text)
            elif kind == "digits":
                hits = sum(a == b for a, b in zip(text, ans, strict=False))
                out[i] = hits / max(len(text), len(ans))
            else:
                got, want = self._steps(text), self._steps(ans)
                pairs = enumerate(zip(got, want, strict=False))
                lead = next((j for j, (a, b) in pairs if a != b), min(len(got), len(want)))
                out[i] = lead / max(len(got), len(want))
        return out

    def _steps(self, text: str) -> list[str]:
        """The units of the ``prefix`` reward: the characters of the answer."""
        return list(text)

    def _step_credit(self, p: Problem, text: str) -> float:
        """The ``steps`` reward of one response (tasks with a chain of steps only)."""
        raise ValueError(f"data.reward='steps' is invalid for {type(self).__name__}")


@dataclass
class AdditionTask(ArithmeticTask):
    """Addition of two ``num_digits``-digit numbers (leading digit non-zero), ``a+b=`` -> ``a + b``.

    Example (``reverse_answer=True``): ``23+58=`` -> ``18`` (81 written backwards).
    """

    @property
    def max_response_len(self) -> int:
        """Longest correct response: ``num_digits + 1`` digits and ``<eos>``."""
        return self.num_digits + 2

    def _range(self) -> tuple[int, int]:
        return 10 ** (self.num_digits - 1) if self.num_digits > 1 else 0, 10**self.num_digits

    def answer(self, p: Problem) -> str:
        """The expected response text: ``str(a + b)``, reversed if ``reverse_answer``."""
        return self._number(p[0] + p[1])


@dataclass
class ChainTask(ArithmeticTask):
    """Running sums modulo ``10^num_digits``: ``s+d=`` -> ``x_1,...,x_L``, ``x_k = (s + k d) mod 10^n``.

    Every value has exactly ``n`` digits, so a prompt has ``2 n + 3`` tokens and a correct
    response ``L (n + 1)`` (``<eos>`` included).
    """

    chain_length: int = 11

    def __post_init__(self) -> None:
        if self.chain_length < 1:
            raise ValueError(f"data.chain_length={self.chain_length} is invalid: expected >= 1")
        super().__post_init__()

    @property
    def max_response_len(self) -> int:
        """Longest response: ``L (n + 1)`` tokens, plus the stray ``=`` of :meth:`alt_answer`."""
        return self.chain_length * (self.num_digits + 1) + 1

    def _range(self) -> tuple[int, int]:
        return 0, 10**self.num_digits

    def prompt(self, p: Problem) -> str:
        """The prompt text ``s+d=`` with both operands zero-padded to ``num_digits``."""
        n = self.num_digits
        return f"{p[0]:0{n}d}+{p[1]:0{n}d}="

    def chain(self, p: Problem) -> list[int]:
        """The values ``x_1..x_L`` of the chain of ``p``."""
        mod = 10**self.num_digits
        return [(p[0] + k * p[1]) % mod for k in range(1, self.chain_length + 1)]

    def alt_answer(self, p: Problem) -> str:
        """The chain closed by a stray ``=`` (the verifier rejects it)."""
        return self.answer(p) + "="

    def _steps(self, text: str) -> list[str]:
        """The units of the ``prefix`` reward: the chain's values."""
        return text.split(",")

    def _parse(self, value: str) -> int | None:
        """A written value (``num_digits`` digits, reversed if ``reverse_answer``) or None."""
        if len(value) != self.num_digits or not value.isdigit():
            return None
        return int(value[::-1] if self.reverse_answer else value)

    def _step_credit(self, p: Problem, text: str) -> float:
        """Share of the chain's steps computed right from the value written before them.

        Step ``k`` is right iff the ``k``-th written value equals ``(v_{k-1} + d) mod 10^n`` with ``v_{k-1}`` the value
        the response itself wrote before it (``v_0 = s``); an unreadable value fails its own step and the next; a value
        past ``chain_length`` is never right. Divided by ``max(values written, chain_length)``: 1 iff the response is
        exactly the answer.
        """
        mod = 10**self.num_digits
        values = [self._parse(v) for v in text.split(",")]
        prev: int | None = p[0]
        right = 0
        for v in values[: self.chain_length]:  # a value past the chain is never right
            right += prev is not None and v is not None and v == (prev + p[1]) % mod
            prev = v
        return right / max(len(values), self.chain_length)

    def answer(self, p: Problem) -> str:
        """The expected response text: the chain, fixed-width values joined by ``,``."""
        return ",".join(self._number(x, self.num_digits) for x in self.chain(p))


def task_from_config(data) -> ArithmeticTask:
    """The task of a ``data`` config section (:class:`~nemo_ais.embedded.config.DataSection`)."""
    common = dict(
        num_digits=data.num_digits,
        eval_size=data.eval_size,
        eval_seed=data.eval_seed,
        reverse_answer=data.reverse_answer,
    )
    if data.task == "chain":
        return ChainTask(chain_length=data.chain_length, **common)
    if data.task == "addition":
        return AdditionTask(**common)
    raise ValueError(f"data.task={data.task!r} is invalid: expected 'chain' or 'addition'")
