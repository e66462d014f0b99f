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
"""Rules shared by the runtime and the offline check, below both (torch-free, stdlib only).

* :mod:`.keep_bf16` -- which linear layers stay in BF16: the ONE rule the twin, the refit
  stream, the vLLM refit patch and ``nemo_ais.preflight`` call.
* :mod:`.vllm_layers` -- vLLM's view of HF names: decoder layer, projection, fused group.
* :mod:`.config_keys` -- dotted-key lookup in a NeMo-RL config mapping.
"""
