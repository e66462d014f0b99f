# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""``nemo-ais`` as the documented commands call it, for ``tests/unit/test_doc_commands.py``.

``python tests/doc_commands.py ARGS`` runs ``nemo-ais ARGS`` where that is cheap and
local, and otherwise does everything short of the expensive part:

* ``analyze``, ``report``, ``--help``, ``--version``: run for real (``nemo_ais.cli.main``).
* ``run`` and ``attribute``: the command line is parsed and the config it names is loaded
  with its overrides and every arm resolved, as ``nemo-ais`` does before it trains (the
  training itself takes CPU minutes; ``tests/e2e/test_embedded_run.py`` runs presets).
* ``calibrate-input-amax``: parsed only (it needs the named checkpoint and, as documented,
  a GPU).

Exit status: that of the command, or 2 for a command line or config ``nemo-ais`` refuses.
"""

from __future__ import annotations

import sys

from nemo_ais.cli import PRESETS, _config_dir, build_parser, main

_CHEAP = {"analyze", "report"}


def check(argv: list[str]) -> int:
    """Run or check ``nemo-ais argv`` as described above; the exit status."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None or command in _CHEAP:
        return main(argv)
    from nemo_ais.embedded.config import load_config, resolve_arm

    args, extra = build_parser().parse_known_args(argv)  # exits 2 on a bad command line
    overrides = [*getattr(args, "overrides", []), *extra]
    if command == "calibrate-input-amax":
        print(f"doc_commands: parsed (not run: needs {args.model} and a GPU)")
        return 0
    preset = "quick" if getattr(args, "quick", False) else args.preset or "default"
    assert preset in ("default", *PRESETS), preset
    path = args.config or _config_dir() / f"{preset}.yaml"
    try:
        raw = load_config(path, overrides)
        if command == "attribute":
            resolve_arm(raw, args.arm)
        else:
            experiment = raw.get("experiment") or {}
            for arm in experiment.get("include") or list(experiment.get("arms") or {}):
                resolve_arm(raw, arm)
    except (ValueError, FileNotFoundError) as err:
        print(f"doc_commands: nemo-ais {command}: invalid config ({path}): {err}", file=sys.stderr)
        return 2
    print(f"doc_commands: nemo-ais {command}: config {path.name} resolves (not trained here)")
    return 0


if __name__ == "__main__":
    sys.exit(check(sys.argv[1:]))
