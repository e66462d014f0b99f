# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``nemo-ais``: the command line of the embedded experiment and its tools.

``run`` (GRPO on the embedded task, every arm x seed of a preset or config), ``report`` (redraw a run's plots and
summary), ``analyze`` (replay a NeMo-RL run's step logs, docs/analyze.md), ``attribute`` (which quantized source
carries the rollout mismatch, docs/low_precision.md) and ``calibrate-input-amax`` (the NVFP4 W4A4 refit's input amax
file, docs/cluster.md); examples in :data:`_EPILOG`. Exit codes: 0 success, 1 a run failed or bad log input, 2 bad
config or arguments, 3 ``analyze --fail-on-alarm`` (or ``alarms.fail_on_alarm=true``) and an alarm fired, 130
interrupted (``run``: checkpoints kept; re-run the same command to resume).
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
from pathlib import Path
from typing import Any

# nemo_ais/embedded/presets/<name>.yaml selectable with --preset (default.yaml: no flag)
PRESETS = (
    "quick",
    "fp4-quick",
    "fp4-long",
    "fp4",
    "fp4-evidence",
    "evidence",
    "addition",
    "dose",
    "dose-quick",
    "dose-long",
    "dose-99",
    "dose-plateau",
)

_EPILOG = """\
examples:
  nemo-ais run                                   # default experiment, 4 arms x 2 seeds
  nemo-ais run --quick                           # <= 60 s smoke run (1 process, 1 seed)
  nemo-ais run --preset evidence                 # FP8, 8 seeds, every correction (docs/results.md)
  nemo-ais run --preset fp4-quick                # <= 90 s: NVFP4 W4A4 + NVFP4 KV arms, W4A16
  nemo-ais run grpo.max_num_steps=100 rollout.kv_cache=bf16 logger.name=bf16-kv
  nemo-ais run rollout.format=nvfp4_w4a4 rollout.kv_cache=nvfp4 logger.name=w4a4
  nemo-ais run experiment.include=[bf16,fp8-ais] experiment.seeds=[0]
  nemo-ais report runs/default
  nemo-ais analyze logs/exp_001 loss_fn.ais.ema=0.9    # a NeMo-RL run's train_data_step*.jsonl
  nemo-ais analyze logs                          # each run below; a resumed run's exp_NNN joined
  nemo-ais analyze runs/default                  # each run below: logs/<arm>_seed<n>
  nemo-ais attribute rollout.format=nvfp4_w4a4 rollout.kv_cache=nvfp4   # who carries the mismatch
  nemo-ais calibrate-input-amax Qwen/Qwen3-8B --prompts train.jsonl --device cuda \
      --out calibration/qwen3_8b_nvfp4_input_amax.json   # W4A4 refit's input_amax_file

Re-running the same command resumes an interrupted run from its last checkpoints.
"""


def version_string() -> str:
    """``nemo-ais <version> from <package dir> (python <X.Y>)`` as ``pip --version``; uninstalled: ``__version__``."""
    from importlib import metadata

    import nemo_ais

    try:
        version = metadata.version("nemo-ais")
    except metadata.PackageNotFoundError:
        version = nemo_ais.__version__
    where = Path(nemo_ais.__file__).resolve().parent
    return f"nemo-ais {version} from {where} (python {sys.version_info[0]}.{sys.version_info[1]})"


def _fail(code: int, command: str, message: object) -> int:
    """Print ``nemo-ais <command>: <message>`` on stderr; return the exit code ``code``."""
    print(f"nemo-ais {command}: {message}", file=sys.stderr)
    return code


def _first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, at most 200 characters: a failure is one line on stderr."""
    return (str(err).strip().splitlines() or [""])[0][:200]


def _config_dir() -> Path:
    from nemo_ais.embedded.config import CONFIG_DIR

    return CONFIG_DIR


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected an integer >= 1")
    return value


_PRESET_HELP = (
    "A shipped preset nemo_ais/embedded/presets/<name>.yaml: quick (<= 60 s smoke run), fp4-quick (quick with NVFP4 "
    "W4A4 / W4A16 rollout arms, <= 90 s), fp4-long (fp4-quick's arms on 99-token chain responses), fp4 (every "
    "correction with NVFP4 W4A4 / W4A16 rollouts, 2 seeds), fp4-evidence (the same, 8 seeds), evidence (FP8 rollouts, "
    "8 seeds, every correction), addition (the 2-digit task), dose (the mismatch dose-response study: levels of "
    "rollout.error_scale x corrections, 6 seeds), dose-quick (its smoke form), dose-long (its two highest levels x "
    "none/tis/ais for 200 steps, 2 seeds), dose-99 (the same levels and arms on 99-token responses, 60 steps, 2 "
    "seeds), dose-plateau (dose at the default run's plateau warm start and lr)."
)
_FLAG = {"action": "store_true"}
_OVERRIDES = {"nargs": "*", "metavar": "key=value"}
_PATH = {"type": Path}  # argparse's default: None
# Each subcommand: (help, description, {flag: add_argument keywords}); flags in a tuple are mutually exclusive.
_SUBCOMMANDS: dict[str, tuple[str, str | None, dict[Any, Any]]] = {
    "run": (
        "Run the four-arm GRPO experiment (BF16, FP8 none/TIS/AIS) x seeds.",
        "Run GRPO on the embedded arithmetic task with the simulated FP8 rollout engine, for every arm x seed of the "
        "config; outputs go to <logger.run_dir>/<logger.name>/ (metrics.jsonl, PNG plots, summary.md, checkpoints).",
        {
            "overrides": {
                **_OVERRIDES,
                "help": "Dotted OmegaConf overrides, e.g. grpo.max_num_steps=20 loss_fn.ais.ema=0.5.",
            },
            ("--config", "--quick", "--preset"): {
                "--config": {**_PATH, "help": "A YAML config file (default: the shipped preset default.yaml)."},
                "--quick": {**_FLAG, "help": "The <= 60 s shipped preset quick.yaml."},
                "--preset": {"choices": PRESETS, "help": _PRESET_HELP},
            },
            "--overwrite": {
                **_FLAG,
                "help": "Delete the run directory's outputs (metrics, checkpoints, logs, plots) and start over.",
            },
        },
    ),
    "report": (
        "Redraw plots and summary.md of a run directory from its metrics.jsonl.",
        "Redraw reward.png, accuracy.png, diagnostics.png, mismatch_vs_entropy.png and summary.md (and a dose-response "
        "run's tolerance.json / .png) from RUN_DIR/metrics.jsonl (or a metrics file).",
        {"run_dir": {"type": Path, "help": "A run directory (or its metrics.jsonl)."}},
    ),
    "analyze": (
        "Replay AIS diagnostics and every correction mode over a NeMo-RL run's step logs.",
        "Read LOG_DIR/train_data_step{N}.jsonl (NeMo-RL's per-step batch logs, in order of N), compute per step the "
        "AIS diagnostics, alpha and the weights of tis/icepop/seq_mask_geo/ais with the core code, run the refit "
        "guard, and write analysis.jsonl, report.md and PNG plots to OUT. If LOG_DIR holds no step file, every run "
        "directory up to 4 levels below it is analysed, each on its own (a NeMo-RL log root, a nemo-ais run directory: "
        "<run_dir>/logs/<arm>_seed<n>); a NeMo-RL run resumed from a checkpoint (logs/exp_001, then exp_002 from step "
        "N on) is analysed as one run.",
        {
            "log_dir": {
                "type": Path,
                "help": "NeMo-RL logger.log_dir of one run, or a directory above runs (each is analysed).",
            },
            "overrides": {
                **_OVERRIDES,
                "help": "loss_fn.ais.<field>=value or alarms.<field>=value, e.g. loss_fn.ais.ema=0.9.",
            },
            "--out": {
                **_PATH,
                "help": "Output directory (default LOG_DIR/ais_analysis; for runs found below "
                "LOG_DIR: OUT/<run's path below LOG_DIR>, default <run>/ais_analysis).",
            },
            "--list": {
                **_FLAG,
                "help": "List the runs found, one a line (a resumed run's launches joined by ' + '), and exit.",
            },
            "--separate-launches": {
                **_FLAG,
                "help": "Analyse each launch of a resumed NeMo-RL run (exp_NNN) on its own instead of as one run.",
            },
            "--config": {
                **_PATH,
                "help": "YAML with loss_fn.ais (e.g. the run's NeMo-RL config) and/or alarms sections.",
            },
            "--skip-bad-rows": {**_FLAG, "help": "Count and skip bad rows instead of failing."},
            "--no-progress": {**_FLAG, "help": "No progress bar."},
            "--no-plots": {**_FLAG, "help": "Skip the PNG plots."},
            "--tolerance": {
                **_PATH,
                "help": "A dose-response run's tolerance.json (nemo-ais run --preset dose) to "
                "place the run's mismatch on (default: the study shipped with nemo_ais, if any).",
            },
            "--fail-on-alarm": {
                **_FLAG,
                "help": "Exit with code 3 if an alarm fired, after writing the report (also "
                "alarms.fail_on_alarm=true).",
            },
        },
    ),
    "attribute": (
        "Attribute the rollout mismatch to weights, activations and KV cache per layer.",
        "Build the twin (simulated rollout engine) of the config's policy in its rollout.format / rollout.kv_cache "
        "(warm-started from the cache if present, else the recipe's init), sample held-out prompts with it, then score "
        "them with one source quantized at a time (and with every source but one): mean |dlogp|, gen_kl_error (k3) and "
        "token_mult_prob_error against the unquantized model on the same tokens. Prints a markdown table; writes "
        "attribution.md, .json and .png to --out.",
        {
            "overrides": {
                **_OVERRIDES,
                "help": "Dotted config overrides, e.g. rollout.format=nvfp4_w4a4 rollout.kv_cache=nvfp4.",
            },
            ("--config", "--preset"): {
                "--config": {**_PATH, "help": "A recipe YAML config."},
                "--preset": {"choices": ("default", *PRESETS), "help": "A shipped preset."},
            },
            "--arm": {"help": "Take the precision of this experiment arm (default: base)."},
            "--prompts": {
                "type": _positive_int,
                "help": "Held-out prompts, at most data.eval_size (64, or data.eval_size if smaller).",
            },
            "--seed": {"type": int, "default": 0, "help": "Sampling seed (0)."},
            "--top": {"type": _positive_int, "default": 16, "help": "Sources printed and plotted (16)."},
            "--out": {**_PATH, "help": "Output directory (<logger.run_dir>/attribution)."},
            "--train-warm-start": {
                **_FLAG,
                "help": "Train the warm start when its cache file is missing (else: the random init).",
            },
            "--no-plot": {**_FLAG, "help": "Skip attribution.png."},
        },
    ),
    "calibrate-input-amax": (
        "Write the NVFP4 W4A4 refit's input_amax_file from a BF16 checkpoint.",
        "Run the BF16 model MODEL on calibration prompts with a hook on every linear the NVFP4 W4A4 engine quantizes "
        "(every decoder-layer linear but MoE routers), record max |input| over the valid tokens (ModelOpt's max "
        "calibration), and write JSON {module name: amax}: the file ais_nvfp4_refit.input_amax_file names (input_scale "
        "= amax / (6 * 448); fused q/k/v and gate/up take the max).",
        {
            "model": {"help": "The BF16 checkpoint the trainer starts from: a local HF dir or hub name."},
            "--out": {"type": Path, "required": True, "help": "The JSON file to write."},
            "--prompts": {
                **_PATH,
                "help": "Calibration prompts: .txt (one a line) or .jsonl (a JSON string or an "
                "object's --prompt-key field a line); default: a small built-in set (smoke "
                "tests only).",
            },
            "--prompt-key": {"default": "prompt", "help": "Field of a .jsonl object (prompt)."},
            "--num-samples": {"type": _positive_int, "default": 512, "help": "First N prompts (512)."},
            "--max-length": {"type": _positive_int, "default": 2048, "help": "Tokens per prompt (2048)."},
            "--batch-size": {"type": _positive_int, "default": 8, "help": "Prompts per forward (8)."},
            "--device": {"choices": ("cpu", "cuda"), "default": "cpu", "help": "(cpu)"},
            "--dtype": {
                "choices": ("bfloat16", "float32"),
                "default": "bfloat16",
                "help": "Weights and activations dtype (bfloat16, as the trainer's checkpoint).",
            },
            "--chat-template": {**_FLAG, "help": "Render each prompt as a user turn of the tokenizer's chat template."},
        },
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``nemo-ais``, built from :data:`_SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="nemo-ais",
        description="AIS for FP8-rollout RL: the embedded one-machine GRPO experiment.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="Log at INFO level.")
    parser.add_argument("--version", action="version", version=version_string())
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(_SUBCOMMANDS) + "}")
    sub.required = True
    for name, (help_text, description, options) in _SUBCOMMANDS.items():
        extra = {"epilog": _EPILOG, "formatter_class": argparse.RawDescriptionHelpFormatter}
        cmd = sub.add_parser(name, help=help_text, description=description, **(extra if name == "run" else {}))
        cmd.set_defaults(command_parser=cmd)  # its usage on an error (main)
        # -v after the subcommand too; SUPPRESS keeps a -v given before it
        cmd.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="Log at INFO level.")
        for flag, kwargs in options.items():
            if isinstance(flag, tuple):  # mutually exclusive options
                group = cmd.add_mutually_exclusive_group()
                for option, option_kwargs in kwargs.items():
                    group.add_argument(option, **option_kwargs)
            else:
                cmd.add_argument(flag, **kwargs)
    return parser


def _attribute(args: argparse.Namespace) -> int:
    import torch

    from nemo_ais.embedded.config import load_config, resolve_arm
    from nemo_ais.embedded.dist import RecipeError
    from nemo_ais.embedded.twin_setup import twin_setup
    from nemo_ais.tools.attribution import attribute_mismatch, attribution_markdown, write_attribution

    path = args.config or _config_dir() / f"{args.preset or 'default'}.yaml"
    try:
        raw = load_config(path, args.overrides)
        cfg = resolve_arm(raw, args.arm)
        prompts = min(64, cfg.data.eval_size) if args.prompts is None else args.prompts
        if prompts > cfg.data.eval_size:
            raise ValueError(
                f"--prompts {prompts} is invalid: expected at most data.eval_size="
                f"{cfg.data.eval_size} (the held-out prompts)"
            )
        # every arm runs from the base config's warm start (nemo-ais run): the same cache file here
        setup = twin_setup(cfg, prompts, train_warm_start=args.train_warm_start, warm_start_cfg=resolve_arm(raw, None))
    except (ValueError, FileNotFoundError) as err:
        return _fail(2, "attribute", f"invalid config or arguments ({path}):\n{err}")
    except RecipeError as err:  # an unreadable warm-start file, an unwritable cache
        return _fail(1, "attribute", err)
    torch.set_num_threads(cfg.cluster.num_threads_per_rank)  # 1: tiny GEMMs, no spin-waits
    try:
        att = attribute_mismatch(
            setup.model,
            cfg.precision,
            setup.ids,
            setup.mask,
            max_new_tokens=setup.max_new_tokens,
            generator=torch.Generator().manual_seed(args.seed),
            eos_token_id=setup.eos,
            pad_token_id=setup.pad,
            temperature=cfg.rollout.temperature,
            what=setup.what,
        )
    except ValueError as err:  # e.g. an in-dim the format cannot block
        return _fail(1, "attribute", err)
    out = args.out or Path(cfg.logger.run_dir) / "attribution"
    print(attribution_markdown(att, top=args.top))  # first: an unwritable OUT loses no result
    try:
        written = write_attribution(att, out, top=args.top, plot=not args.no_plot)
    except OSError as err:
        return _fail(1, "attribute", f"cannot write {err.filename or out}: {err.strerror or err}")
    print(f"nemo-ais attribute: wrote {', '.join(str(p) for p in written)}")
    return 0


def _calibrate_input_amax(args: argparse.Namespace) -> int:
    from nemo_ais.tools.input_amax_file import (
        calibrate_input_amax,
        calibration_batches,
        check_out_path,
        load_causal_lm,
        read_prompts,
        write_input_amax,
    )

    try:
        check_out_path(args.out)  # before the model loads and runs
        prompts = read_prompts(args.prompts, num_samples=args.num_samples, prompt_key=args.prompt_key)
        model, tokenizer = load_causal_lm(args.model, device=args.device, dtype=args.dtype)
        batches = calibration_batches(
            tokenizer, prompts, max_length=args.max_length, batch_size=args.batch_size, chat_template=args.chat_template
        )
    except ValueError as err:
        return _fail(2, "calibrate-input-amax", f"invalid arguments: {err}")
    try:
        amax = calibrate_input_amax(model, batches)
        path = write_input_amax(amax, args.out)
    except (ValueError, OSError) as err:  # non-finite activations, an unwritable --out
        return _fail(1, "calibrate-input-amax", err)
    except RuntimeError as err:  # e.g. out of memory in a forward: one line, not a traceback
        return _fail(
            1, "calibrate-input-amax", f"the calibration forward failed: {type(err).__name__}: {_first_line(err)}"
        )
    values = list(amax.values())
    print(
        f"nemo-ais calibrate-input-amax: {len(amax)} modules, {len(prompts)} prompts, amax "
        f"{min(values):.4g}..{max(values):.4g}; wrote {path}"
    )
    return 0


def _run(args: argparse.Namespace) -> int:
    from nemo_ais.embedded.config import load_config
    from nemo_ais.embedded.dist import RecipeError
    from nemo_ais.embedded.experiment import run_experiment

    preset = "quick" if args.quick else args.preset or "default"
    path = args.config or _config_dir() / f"{preset}.yaml"
    try:
        raw = load_config(path, args.overrides)
    except (ValueError, FileNotFoundError) as err:
        return _fail(2, "run", f"invalid config ({path}):\n{err}")
    try:
        run_dir = run_experiment(raw, overwrite=args.overwrite)
    except KeyboardInterrupt:
        print("", file=sys.stderr)  # below the progress bar
        return _fail(
            130, "run", "interrupted. Checkpoints written so far are kept; re-run the same command to resume from them."
        )
    except RecipeError as err:
        return _fail(1, "run", err)
    print(f"nemo-ais run: done; outputs in {run_dir} (see {run_dir / 'summary.md'})")
    return 0


def _report(args: argparse.Namespace) -> int:
    from nemo_ais.embedded.report import write_report

    try:
        written = write_report(args.run_dir)
    except (FileNotFoundError, ValueError) as err:
        return _fail(2, "report", err)
    for path in written:
        print(path)
    return 0


def _analyze(args: argparse.Namespace) -> int:
    from nemo_ais.analyze import BadInputError, load_analysis_config
    from nemo_ais.analyze.analysis import global_batches_per_step, trains_with_filtered_sampling
    from nemo_ais.analyze.reader import SEARCH_DEPTH, find_log_dirs, join_launches

    try:
        config, alarm_config = load_analysis_config(args.config, args.overrides)
        batches = global_batches_per_step(args.config) if args.config else 1
        filtered = trains_with_filtered_sampling(args.config) if args.config else False
    except (ValueError, TypeError, FileNotFoundError) as err:
        return _fail(2, "analyze", f"invalid config: {err}")
    try:
        log_dirs = find_log_dirs(args.log_dir)
    except BadInputError as err:
        return _fail(1, "analyze", err)
    if not log_dirs:
        return _fail(
            1,
            "analyze",
            f"{args.log_dir}:0: no train_data_step{{N}}.jsonl files in it or {SEARCH_DEPTH} levels below it (NeMo-RL "
            "writes them to logger.log_dir during GRPO training; nemo-ais run to <run_dir>/logs/<arm>_seed<n>)",
        )
    one = log_dirs == [args.log_dir]  # LOG_DIR is one run's log_dir: the launches beside it are _warn_if_resumed's
    runs = [[d] for d in log_dirs] if args.separate_launches or one else join_launches(log_dirs)
    if args.list:
        print(*(" + ".join(map(str, run)) for run in runs), sep="\n")
        return 0
    if one:
        return _analyze_one(args, args.log_dir, args.out, "", config, alarm_config, batches, filtered)
    print(f"nemo-ais analyze: {len(runs)} run(s) below {args.log_dir}")
    codes = []
    for run in runs:
        rel = run[-1].relative_to(args.log_dir)  # a resumed run writes beside its last launch
        out = args.out / rel if args.out is not None else None
        name = " + ".join(str(d.relative_to(args.log_dir)) for d in run)
        code = _analyze_one(args, run, out, f"{name}: ", config, alarm_config, batches, filtered)
        if code == 130:  # interrupted: stop here
            return code
        codes.append(code)
    # a run that failed (1) outranks an alarm (3): both are reported, run by run, above
    return 1 if 1 in codes else max(codes)


def _analyze_one(args, launches, out, prefix, config, alarm_config, batches, filtered) -> int:
    """Analyse one run (its ``log_dir``, or a resumed run's launches); print its summary (``prefix``: its name).

    ``batches``, ``filtered``: the run config's global batches per step and whether it filtered its sampling.
    """
    log_dir = launches if isinstance(launches, Path) else launches[-1]
    from nemo_ais.analyze import BadInputError, analyze_run
    from nemo_ais.analyze.analysis import ANALYSIS_FILE, output_dir
    from nemo_ais.analyze.reader import format_steps

    try:
        result = analyze_run(
            launches,
            out,
            config,
            alarm_config,
            skip_bad_rows=args.skip_bad_rows,
            progress=not args.no_progress,
            plots=not args.no_plots,
            global_batches_per_step=batches,
            tolerance=args.tolerance,
            filtered_sampling=filtered,
        )
    except KeyboardInterrupt:
        partial = output_dir(log_dir, out) / f"{ANALYSIS_FILE}.partial"
        return _fail(130, "analyze", f"{prefix}interrupted; the steps analysed so far, if any: {partial}")
    except BadInputError as err:
        return _fail(1, "analyze", err)
    except OSError as err:  # unreadable file, full disk: one line, no traceback
        return _fail(1, "analyze", f"{err.filename or log_dir}: {err.strerror or err}")
    except Exception as err:  # backstop: one line naming the input, never a traceback
        first = _first_line(err)
        return _fail(1, "analyze", f"{log_dir}: unexpected {type(err).__name__}: {first} (run with -v and report it)")
    skipped = f"; {result.bad_rows} bad rows skipped" if result.bad_rows else ""
    if result.bad_readback_rows:
        skipped += f"; {result.bad_readback_rows} bad refit readback rows skipped"
    steps = [r["step"] for r in result.rows]
    missing = (
        f", {len(result.missing_steps)} missing: {format_steps(result.missing_steps)}" if result.missing_steps else ""
    )
    print(
        f"nemo-ais analyze: {prefix}{len(steps)} steps ({steps[0]}..{steps[-1]}{missing}), "
        f"{len(result.alarms)} alarm(s){skipped}; see {result.out_dir / 'report.md'}"
    )
    for alarm in result.alarms[:10]:
        print(f"  alarm: {alarm}")
    # alarms.fail_on_alarm=true (the online key) means --fail-on-alarm offline
    fail = args.fail_on_alarm or alarm_config.fail_on_alarm
    return 3 if fail and result.alarms else 0


_COMMANDS = {
    "run": _run,
    "report": _report,
    "analyze": _analyze,
    "attribute": _attribute,
    "calibrate-input-amax": _calibrate_input_amax,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nemo-ais`` console script and ``python -m nemo_ais``."""
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8 prints escaped, not as a UnicodeEncodeError
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":  # surrogateescape prints the bytes
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # analyze, attribute: key=value overrides may follow the options
        if args.command not in ("analyze", "attribute") or any(e.startswith("-") or "=" not in e for e in extra):
            args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides += extra
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return _COMMANDS[args.command](args)
    except KeyboardInterrupt:  # run and analyze say what they kept; the other commands write at the end
        return _fail(130, args.command, "interrupted before its output was complete")


if __name__ == "__main__":
    sys.exit(main())
