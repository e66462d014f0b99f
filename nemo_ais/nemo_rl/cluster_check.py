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
"""Alias of :mod:`nemo_ais.preflight` (``python -m nemo_ais.nemo_rl.cluster_check``, torch-free)."""

import sys

from nemo_ais.preflight import *  # noqa: F403
from nemo_ais.preflight import __all__  # noqa: F401
from nemo_ais.preflight.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m nemo_ais.nemo_rl.cluster_check"))
