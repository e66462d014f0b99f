# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The NVFP4 W4A4 refit's ``input_amax_file``: static input amax of a BF16 checkpoint.

The W4A4 refit streams ``<m>.input_scale = amax / (6 * 448)`` from a JSON ``{module name: amax}``, written by
``nemo-ais calibrate-input-amax`` (``docs/cluster.md``): read prompts (step 1), batch them left-padded (2), observe
``max |x|`` of each quantized module's input over valid tokens (3, ModelOpt's ``max``), check (4), write (5).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from nemo_ais.rollout.calibration import max_into, observe_input_amax, shared_input_amax
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.modules import quantized_module_names

logger = logging.getLogger(__name__)

# Used without --prompts: a smoke-test set; calibrate a run on its own training prompts.
DEFAULT_PROMPTS = (
    "Solve for x: 3x + 7 = 22. Show your reasoning step by step.",
    "A train travels 180 km in 2.5 hours. What is its average speed in km/h?",
    "Find the sum of all positive divisors of 360.",
    "Let f(x) = x^3 - 6x^2 + 11x - 6. Find all real roots of f.",
    "How many ways can 5 distinct books be arranged on a shelf if two must be adjacent?",
    "Prove that the square root of 2 is irrational.",
    "What is the remainder when 7^100 is divided by 13?",
    "Compute the integral of x * e^x from 0 to 1.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain the difference between a process and a thread in an operating system.",
    "Summarize the causes of the French Revolution in three sentences.",
    "Translate into French: The weather is nice today, so we will walk to the market.",
    "A rectangle has perimeter 46 and area 120. Find its side lengths.",
    "If the probability of rain on each of three days is 0.3, independently, what is the "
    "probability that it rains on at least one day?",
    "Simplify (2 + 3i)(4 - i) and give the result in the form a + bi.",
    "List the first ten prime numbers and their sum.",
)


def read_prompts(path: str | Path | None, *, num_samples: int | None = None, prompt_key: str = "prompt") -> list[str]:
    """Step 1: the first ``num_samples`` prompts of ``path`` (``.txt``, ``.jsonl``; None: defaults).

    Raises:
        ValueError: naming ``--prompts``, the file and the line.
    """
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"num_samples (--num-samples)={num_samples} is invalid: expected >= 1")
    if path is None:
        return list(DEFAULT_PROMPTS[:num_samples])
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--prompts {path}: no such file (expected .jsonl or .txt prompts)")
    if path.suffix not in (".jsonl", ".txt"):
        raise ValueError(
            f"--prompts {path}: expected a .jsonl file (one JSON row a line) or a .txt file (one prompt a line)"
        )
    jsonl = path.suffix == ".jsonl"
    prompts = []
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a UTF-8 BOM is not part of the first prompt
    except OSError as err:
        raise ValueError(f"--prompts {path}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"--prompts {path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    for line_no, line in enumerate(text.split("\n"), start=1):  # not splitlines(): U+2028 is inside a line
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        prompts.append(_jsonl_prompt(line, path, line_no, prompt_key) if jsonl else line)
        if num_samples is not None and len(prompts) == num_samples:
            break
    if not prompts:
        raise ValueError(f"--prompts {path}: no prompt in the file (expected one a line)")
    return prompts


def _jsonl_prompt(line: str, path: Path, line_no: int, prompt_key: str) -> str:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"--prompts {path} line {line_no}: not JSON ({err})") from err
    prompt = row.get(prompt_key) if isinstance(row, dict) else row
    if not isinstance(prompt, str) or not prompt:
        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise ValueError(
            f"--prompts {path} line {line_no}: got {keys}, expected a non-empty JSON string "
            f"or an object with a non-empty string {prompt_key!r} (--prompt-key)"
        )
    return prompt


def calibration_batches(
    tokenizer, prompts: Sequence[str], *, max_length: int, batch_size: int, chat_template: bool = False
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Step 2: left-padded ``(input_ids, attention_mask)`` int64 ``[B, <= max_length]``, lazily.

    Raises:
        ValueError: ``max_length`` or ``batch_size`` < 1, or no pad nor EOS token.
    """
    for field, flag, value in (("max_length", "--max-length", max_length), ("batch_size", "--batch-size", batch_size)):
        if value < 1:
            raise ValueError(f"{field} ({flag})={value} is invalid: expected >= 1")
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("tokenizer: no pad_token and no eos_token to left-pad the batches")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if chat_template:
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]
    return _batches(tokenizer, prompts, max_length, batch_size, chat_template)


def _batches(tokenizer, prompts, max_length, batch_size, chat_template):
    for start in range(0, len(prompts), batch_size):
        enc = tokenizer(
            list(prompts[start : start + batch_size]),
            add_special_tokens=not chat_template,  # the template holds them (NeMo-RL's processors too)
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        yield enc["input_ids"].to(torch.int64), enc["attention_mask"].to(torch.int64)


def input_amax_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules the W4A4 twin quantizes (ValueError: in-dim not a multiple of 16, or experts)."""
    config = RolloutPrecisionConfig(format="nvfp4_w4a4")
    modules = {n: model.get_submodule(n) for n in quantized_module_names(model, config)}
    fused = [n for n, m in modules.items() if not isinstance(m, nn.Linear)]
    if fused:
        raise ValueError(
            f"{fused[0]}: a fused MoE experts module ({len(fused)} in the model); calibrate-input-amax hooks nn.Linear "
            "inputs only (dense models, per-expert linears), and the W4A4 refit of fused experts needs an amax per "
            "expert (...experts.<e>.gate_up_proj) it cannot observe: roll such a model out in nvfp4_w4a16"
        )
    return modules


@torch.no_grad()
def calibrate_input_amax(model: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Steps 3-4: ``{module name: max |x|}`` (python floats) over every batch, in model order.

    Raises:
        ValueError: no batch, a module never observed, or a non-finite amax.
    """
    modules = input_amax_modules(model)
    device = next(model.parameters()).device
    seen: dict[str, torch.Tensor] = {}
    n_batches = 0
    for input_ids, attention_mask in batches:
        observed = observe_input_amax(model, modules, input_ids.to(device), attention_mask.to(device))
        for name, amax in observed.items():
            max_into(seen, name, amax)
        n_batches += 1
    if n_batches == 0:
        raise ValueError("calibrate_input_amax: no calibration batch (expected >= 1 prompt)")
    return {name: float(amax) for name, amax in shared_input_amax(modules, seen).items()}


def write_input_amax(amax: Mapping[str, float], path: str | Path) -> Path:
    """Step 5: ``{module name: amax}`` as JSON at ``path`` (ValueError: empty or a bad value)."""
    if not amax:
        raise ValueError(f"{path}: no module to write (the model has no W4A4 linear)")
    bad = {k: v for k, v in amax.items() if not (math.isfinite(v) and v >= 0)}
    if bad:
        raise ValueError(f"{path}: amax must be finite and >= 0, got {bad}")
    path = check_out_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")  # a refit never reads a half-written file
    partial.write_text(json.dumps(dict(amax), indent=1) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def check_out_path(path: str | Path) -> Path:
    """``--out`` as a path a file can be written at (ValueError: a directory), checked before any forward."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--out {path}: a directory; expected the path of the JSON file to write")
    return path


def load_causal_lm(model: str, *, device: str = "cpu", dtype: str = "bfloat16"):
    """``(model, tokenizer)`` of a local directory or hub name, eval mode, on ``device``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available here (use --device cpu)")
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"--dtype {dtype!r} is invalid: expected 'bfloat16' or 'float32'")
    if model.startswith("~"):
        model = str(Path(model).expanduser())
    if model.startswith(("/", "./", "../")) and not Path(model).is_dir():
        raise ValueError(
            f"MODEL {model!r}: no such directory (expected a local checkpoint directory or a "
            "Hugging Face model id such as Qwen/Qwen3-8B)"
        )
    from safetensors import SafetensorError

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
        lm, info = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype, output_loading_info=True)
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:  # Runtime / Safetensor: a corrupt file
        first = (str(err).strip().splitlines() or [""])[0]
        raise ValueError(f"MODEL {model!r}: cannot load a causal LM and its tokenizer ({first})") from err
    missing = [*info.get("missing_keys", ()), *info.get("mismatched_keys", ())]
    if missing:  # left at random init: calibrating them would write a wrong file
        raise ValueError(
            f"MODEL {model!r}: {len(missing)} weight(s) missing from the checkpoint (e.g. {sorted(map(str, missing))[:3]}); "
            "expected a complete checkpoint of the model its config.json names"
        )
    if len(tokenizer) <= 1:
        raise ValueError(f"MODEL {model!r}: no tokenizer files in it (expected the checkpoint's tokenizer)")
    return lm.to(device).eval(), tokenizer
