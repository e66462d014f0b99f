# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""``nemo-ais --version``: the installed distribution's version and where it imports from.

The installed (non-editable) wheel is checked in ``tests/e2e/test_wheel.py``.
"""

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import nemo_ais
from nemo_ais.cli import main

PACKAGE_DIR = Path(nemo_ais.__file__).resolve().parent


def test_version_is_the_distributions(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out.strip()
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert out == f"nemo-ais {metadata.version('nemo-ais')} from {PACKAGE_DIR} (python {python})"


def test_package_version_matches_the_metadata():
    assert nemo_ais.__version__ == metadata.version("nemo-ais")


def test_version_needs_no_subcommand_and_leaves_verbose_alone(capsys):
    """``-v`` stays ``--verbose``: only the long flag prints the version."""
    with pytest.raises(SystemExit) as exited:
        main(["-v"])  # no subcommand: a usage error, not the version
    assert exited.value.code == 2
    assert f"nemo-ais {metadata.version('nemo-ais')}" not in capsys.readouterr().out


def test_module_entry_point_prints_it():
    out = subprocess.run(
        [sys.executable, "-m", "nemo_ais", "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith(f"nemo-ais {metadata.version('nemo-ais')} from ")


@pytest.mark.parametrize(
    ("argv", "verbose"),
    [
        (["analyze", "logs"], False),
        (["-v", "analyze", "logs"], True),
        (["analyze", "logs", "-v"], True),  # after the subcommand too (docs/analyze.md: -v)
        (["run", "--quick", "grpo.max_num_steps=2", "--verbose"], True),
    ],
)
def test_verbose_is_read_before_and_after_the_subcommand(argv, verbose):
    from nemo_ais.cli import build_parser

    assert build_parser().parse_args(argv).verbose is verbose


@pytest.mark.parametrize("argv", [["run", "--resume"], ["analyze", "logs", "--nope"]])
def test_an_unknown_option_prints_its_subcommands_usage(argv, capsys):
    with pytest.raises(SystemExit, match="2"):
        main(argv)
    err = capsys.readouterr().err
    assert err.startswith(f"usage: nemo-ais {argv[0]} ")
    assert f"nemo-ais {argv[0]}: error: unrecognized arguments: {argv[-1]}" in err
