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
"""The embedded experiment behind ``nemo-ais run``: GRPO with a quantized rollout on one CPU.

Modules: ``config`` / ``sections`` (validated YAML), ``tokenizer`` / ``task`` (verifiable
arithmetic), ``model`` (tiny Qwen2), ``warmstart`` (cached SFT), ``rollout`` (chunked twin
generation, group advantages), ``aligned`` (QaRL's trainer forward), ``dist`` (gloo DP
harness), ``checkpoint``, ``recipe`` (the torchtune-style GRPO loop), ``logs`` (metrics and
batch logs), ``experiment`` (every arm x seed) and ``report`` / ``stats`` / ``plots``.
"""
