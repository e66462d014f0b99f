# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The embedded experiment behind ``nemo-ais run``: GRPO with a quantized rollout on one CPU.

Modules: ``config`` / ``sections`` (validated YAML), ``tokenizer`` / ``task`` (verifiable
arithmetic), ``model`` (tiny Qwen2), ``warmstart`` (cached SFT), ``rollout`` (chunked twin
generation, group advantages), ``aligned`` (QaRL's trainer forward), ``dist`` (gloo DP
harness), ``checkpoint``, ``recipe`` (the torchtune-style GRPO loop), ``logs`` (metrics and
batch logs), ``experiment`` (every arm x seed) and ``report`` / ``stats`` / ``plots``.
"""
