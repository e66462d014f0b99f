# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""Character-level tokenizer of the embedded arithmetic task (built locally, nothing fetched).

Vocabulary: three special tokens (``<pad>``, ``<bos>``, ``<eos>``), the ten digits, ``+``,
``=`` and ``,``; ``vocab_size`` is rounded up to a multiple of 8 (unused ids are never produced).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_SPECIALS = ("<pad>", "<bos>", "<eos>")
_CHARS = "0123456789+=,"


class CharTokenizer:
    """Maps characters to ids and back; ``pad_id=0``, ``bos_id=1``, ``eos_id=2``."""

    def __init__(self, chars: str = _CHARS) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError(f"chars={chars!r} is invalid: expected distinct characters")
        self.itos: list[str] = [*_SPECIALS, *chars]
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.vocab_size = -(-len(self.itos) // 8) * 8

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of ``text`` (``<bos>``/``<eos>`` if asked); ``ValueError`` names bad characters."""
        bad = sorted({c for c in text if c not in self.stoi or c in _SPECIALS})
        if bad:
            raise ValueError(f"text={text!r} is invalid: characters {bad} are not in {_CHARS!r}")
        ids = [self.stoi[c] for c in text]
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def decode(self, ids: Sequence[int] | torch.Tensor, *, stop_at_eos: bool = True, unknown: str = "") -> str:
        """Text of ``ids``; stops at the first ``<eos>`` by default.

        An id that is no character (a special token, or one of the unused ids up to ``vocab_size``) reads as
        ``unknown``: dropped by default, a character no answer holds where a response is scored.
        """
        ids = list(ids.tolist() if isinstance(ids, torch.Tensor) else ids)
        if stop_at_eos and self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return "".join(self.itos[i] if len(_SPECIALS) <= i < len(self.itos) else unknown for i in ids)
