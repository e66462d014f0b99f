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
"""Arms the AIS FP8 refit hook in processes started with this folder on PYTHONPATH.

``launchers/run_grpo_ais.py`` puts this folder on ``PYTHONPATH`` and sets
``NEMO_AIS_FP8_REFIT`` only when the ``ais_fp8_refit`` section enables it; every other
process is unaffected. Note: a ``sitecustomize`` earlier on ``sys.path`` would shadow
this one.
"""

import os

if os.environ.get("NEMO_AIS_FP8_REFIT"):
    from nemo_ais.nemo_rl.refit import config_from_env, install_on_import

    install_on_import(config_from_env())
