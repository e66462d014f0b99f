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
"""``nemo-ais``: the command line of the embedded experiment.

``nemo-ais run [--quick] [--config FILE] [--overwrite] [key=value ...]`` runs the four-arm
FP8 / AIS GRPO experiment of ``configs/local/default.yaml`` (``--quick``:
``configs/local/quick.yaml``); ``nemo-ais report RUN_DIR`` redraws its plots and summary.
Exit codes: 0 success, 1 a run failed (message printed), 2 bad config or arguments,
130 interrupted (checkpoints kept; re-run the same command to resume).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

__all__ = ["main"]

_EPILOG = """\
examples:
  nemo-ais run                                   # default experiment, 4 arms x 3 seeds
  nemo-ais run --quick                           # <= 60 s smoke run (1 process, 1 seed)
  nemo-ais run grpo.max_num_steps=100 rollout.fp8.kv_cache_fp8=true logger.name=kv
  nemo-ais run experiment.include=[bf16,fp8-ais] experiment.seeds=[0]
  nemo-ais report runs/default

Re-running the same command resumes an interrupted run from its last checkpoints.
"""


def _config_dir() -> Path:
    from nemo_ais.embedded.config import CONFIG_DIR

    return CONFIG_DIR


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``nemo-ais`` (subcommands ``run`` and ``report``)."""
    parser = argparse.ArgumentParser(
        prog="nemo-ais",
        description="AIS for FP8-rollout RL: the embedded one-machine GRPO experiment.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="Log at INFO level.")
    sub = parser.add_subparsers(dest="command", metavar="{run,report}")
    sub.required = True

    run = sub.add_parser(
        "run",
        help="Run the four-arm GRPO experiment (BF16, FP8 none/TIS/AIS) x seeds.",
        description="Run GRPO on the embedded arithmetic task with the simulated FP8 rollout "
        "engine, for every arm x seed of the config; outputs go to "
        "<logger.run_dir>/<logger.name>/ (metrics.jsonl, PNG plots, summary.md, checkpoints).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="Dotted OmegaConf overrides, e.g. grpo.max_num_steps=20 loss_fn.ais.ema=0.5.",
    )
    preset = run.add_mutually_exclusive_group()
    preset.add_argument(
        "--config",
        type=Path,
        default=None,
        help="YAML config (default: configs/local/default.yaml).",
    )
    preset.add_argument(
        "--quick", action="store_true", help="The <= 60 s preset configs/local/quick.yaml."
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="Delete the run directory's metrics and checkpoints and start over.",
    )

    report = sub.add_parser(
        "report",
        help="Redraw plots and summary.md of a run directory from its metrics.jsonl.",
        description="Redraw reward.png, accuracy.png, diagnostics.png and summary.md from "
        "RUN_DIR/metrics.jsonl (or a metrics file).",
    )
    report.add_argument("run_dir", type=Path, help="A run directory (or its metrics.jsonl).")
    return parser


def _run(args: argparse.Namespace) -> int:
    from nemo_ais.embedded.config import load_config
    from nemo_ais.embedded.dist import RecipeError
    from nemo_ais.embedded.recipe import run_experiment

    path = args.config or _config_dir() / ("quick.yaml" if args.quick else "default.yaml")
    try:
        raw = load_config(path, args.overrides)
    except (ValueError, FileNotFoundError) as err:
        print(f"nemo-ais run: invalid config ({path}):\n{err}", file=sys.stderr)
        return 2
    try:
        run_dir = run_experiment(raw, overwrite=args.overwrite)
    except KeyboardInterrupt:
        print(
            "\nnemo-ais run: interrupted. Checkpoints written so far are kept; re-run the same "
            "command to resume from them.",
            file=sys.stderr,
        )
        return 130
    except RecipeError as err:
        print(f"nemo-ais run: {err}", file=sys.stderr)
        return 1
    print(f"nemo-ais run: done; outputs in {run_dir} (see {run_dir / 'summary.md'})")
    return 0


def _report(args: argparse.Namespace) -> int:
    from nemo_ais.embedded.report import write_report

    try:
        written = write_report(args.run_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"nemo-ais report: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nemo-ais`` console script and ``python -m nemo_ais``."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return _run(args) if args.command == "run" else _report(args)


if __name__ == "__main__":
    sys.exit(main())
