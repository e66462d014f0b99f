# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""NeMo-RL's real ``Logger``, as the tests that write or compare step logs build it.

``from nemo_rl_logs import nemo_rl_logger`` (``tests/`` is on ``sys.path``, as for ``oracles``).
"""


def nemo_rl_logger(log_dir):
    """Upstream's Logger with every backend off (it still writes the jsonl files)."""
    from nemo_rl.utils.logger import Logger

    return Logger(
        {
            "log_dir": str(log_dir),
            "wandb_enabled": False,
            "swanlab_enabled": False,
            "tensorboard_enabled": False,
            "mlflow_enabled": False,
            "monitor_gpus": False,
        }
    )
