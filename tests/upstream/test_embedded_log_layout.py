# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""The embedded recipe's ``train_data_step{N}.jsonl`` equals what NeMo-RL's REAL logger writes.

``GRPORecipe._log_train_data`` writes each step's global batch in NeMo-RL v0.7.0's layout.
Here a tiny real embedded run (``nemo-ais run``, task=addition) writes its step files; from
the rows of each file the test rebuilds the batch as upstream's ``grpo_train`` would hold
it, with upstream's own functions wherever the rows carry enough to call them:

* the per-sample message logs (user prompt, assistant response with its rollout
  log-probs), then ``add_grpo_token_loss_masks_and_generation_logprobs`` and
  ``batched_message_log_to_flat_message`` (``nemo_rl/algorithms/grpo.py``,
  ``nemo_rl/data/llm_message_utils.py``): token_ids int64 right-padded with pad_id to the
  longest sequence (``make_sequence_length_divisible_by=1``, the TP=1 value of upstream's
  GRPO configs), token_loss_mask int64, generation_logprobs float32 (0 on the prompt and
  the padding), input_lengths int32, content a per-sample list of the message texts;
* ``train_data`` as ``grpo_train`` builds it: sample_mask = loss_multiplier float32,
  rewards float32, advantages float32 ``[B, 1].expand(mask.shape)``
  (``GRPOAdvantageEstimator.compute_advantage``), prev_logprobs float32 as
  ``policy.get_logprobs`` returns them: 0 at position 0 and, after
  ``LogprobsPostProcessor``'s ``post_attention_mask``, 0 at every position >= the
  sample's input length. (Its prompt positions -- real log-probs upstream -- cannot be
  rebuilt without the model: they are taken from our rows as they are.)

Then ``log_data`` is filled exactly as ``grpo_train``'s logging step fills it and written
by a real ``nemo_rl.utils.logger.Logger`` (every backend off) through
``log_batched_dict_as_jsonl``; the two files must be identical line by line as parsed
JSON: same keys in the same order, same nesting (each value a batch of one), int vs float,
same numbers. ``nemo-ais analyze`` must read the run's log directory.
"""

import json

import pytest
import torch
from nemo_rl_logs import nemo_rl_logger

from nemo_ais.cli import main
from nemo_ais.embedded.tokenizer import CharTokenizer

pytestmark = [pytest.mark.nemo_rl, pytest.mark.timeout(300)]

ARM, SEED, STEPS = "fp8-ais", 0, 2
NUM_DIGITS = 2
PROMPT_LEN = 2 * NUM_DIGITS + 3  # <bos> a + b =
BATCH = 4 * 4  # prompts x generations per step (global batch)
# Explicit task and sizes: independent of nemo_ais/embedded/presets/default.yaml beyond its schema.
TINY = [
    "data.task=addition",
    f"data.num_digits={NUM_DIGITS}",
    "data.reward=digits",
    "data.reverse_answer=true",
    "data.sft_alt_fraction=0.0",
    "data.eval_size=16",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "rollout.prompts_per_chunk=2",
    f"grpo.max_num_steps={STEPS}",
    "grpo.val_period=0",
    "policy.train_micro_batch_size=8",
    f"experiment.include=[{ARM}]",
    f"experiment.seeds=[{SEED}]",
    "checkpointing.enabled=false",
    "cluster.dp_size=1",
    "logger.progress_bar=false",
    "logger.plots=false",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout_run")
    argv = [
        "run",
        "--quick",
        f"logger.run_dir={root}",
        "logger.name=run",
        f"policy.warm_start.cache_dir={root / 'cache'}",
        *TINY,
    ]
    assert main(argv) == 0
    return root / "run"


def _log_dir(run_dir):
    return run_dir / "logs" / f"{ARM}_seed{SEED}"


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _upstream_log_data(rows, tok):
    """``log_data`` of grpo_train's logging step for the batch these rows describe."""
    from nemo_rl.algorithms.grpo import add_grpo_token_loss_masks_and_generation_logprobs
    from nemo_rl.data.llm_message_utils import batched_message_log_to_flat_message
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    message_logs = []
    for r in rows:
        ids, n = r["token_ids"][0], r["input_lengths"][0]
        prompt, response = ids[:PROMPT_LEN], ids[PROMPT_LEN:n]
        # the rows really are <bos>ab+cd= then the response (else the split is wrong)
        assert prompt[0] == tok.bos_id and len(tok.decode(prompt)) == PROMPT_LEN - 1, prompt
        assert response and tok.decode(prompt)[-1] == "=", (prompt, response)
        message_logs.append(
            [
                {"role": "user", "content": tok.decode(prompt), "token_ids": torch.tensor(prompt, dtype=torch.long)},
                {
                    "role": "assistant",
                    "content": tok.decode(response),
                    "token_ids": torch.tensor(response, dtype=torch.long),
                    "generation_logprobs": torch.tensor(r["generation_logprobs"][0][PROMPT_LEN:n], dtype=torch.float32),
                },
            ]
        )
    add_grpo_token_loss_masks_and_generation_logprobs(message_logs)
    flat_messages, input_lengths = batched_message_log_to_flat_message(
        message_logs, pad_value_dict={"token_ids": tok.pad_id}, make_sequence_length_divisible_by=1
    )
    train_data = BatchedDataDict(
        {
            "input_ids": flat_messages["token_ids"],
            "input_lengths": input_lengths,
            "generation_logprobs": flat_messages["generation_logprobs"],
            "token_mask": flat_messages["token_loss_mask"],
            "sample_mask": torch.tensor([r["sample_loss_mask"][0] for r in rows], dtype=torch.float32),
        }
    )
    width = train_data["input_ids"].shape[1]
    prev = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        n = r["input_lengths"][0]
        prev[i, 1:n] = torch.tensor(r["prev_logprobs"][0][1:n], dtype=torch.float32)
    train_data["prev_logprobs"] = prev
    per_sample = torch.tensor([r["advantages"][0][0] for r in rows], dtype=torch.float32)
    train_data["advantages"] = per_sample.unsqueeze(-1).expand(train_data["token_mask"].shape)
    rewards = torch.tensor([r["rewards"][0] for r in rows], dtype=torch.float32)
    assert train_data["input_ids"].dtype == train_data["token_mask"].dtype == torch.int64
    assert input_lengths.dtype == torch.int32

    # grpo_train's logging step (use_dynamic_sampling off, no agent_ref), key by key
    log_data = {}
    log_data["content"] = flat_messages["content"]
    log_data["rewards"] = rewards.tolist()
    log_data["input_lengths"] = input_lengths.tolist()
    log_data["token_ids"] = train_data["input_ids"].tolist()
    log_data["token_loss_mask"] = train_data["token_mask"].tolist()
    log_data["sample_loss_mask"] = train_data["sample_mask"].tolist()
    log_data["advantages"] = train_data["advantages"].tolist()
    log_data["generation_logprobs"] = train_data["generation_logprobs"].tolist()
    log_data["prev_logprobs"] = train_data["prev_logprobs"].tolist()
    return log_data


def _short(value):
    text = json.dumps(value)
    return text if len(text) <= 160 else text[:157] + "..."


def _differences(ours, theirs):
    """``{what: first example}`` of every way the parsed lines differ (empty: identical)."""
    out = {}
    if len(ours) != len(theirs):
        out["line count"] = f"ours {len(ours)}, upstream {len(theirs)}"  # then the common lines
    for line, (o, t) in enumerate(zip(ours, theirs, strict=False), start=1):
        if list(o) != list(t):
            out.setdefault("key order", f"line {line}: ours {list(o)}, upstream {list(t)}")
        for key in dict.fromkeys([*t, *o]):
            # json.dumps tells 1 from 1.0 and [x] from [[x]], which == does not
            if json.dumps(o.get(key)) != json.dumps(t.get(key)):
                out.setdefault(key, f"line {line}: ours {_short(o.get(key))} | upstream {_short(t.get(key))}")
    return out


def test_step_files_equal_what_nemo_rl_logger_writes(run_dir, tmp_path):
    ours_dir = _log_dir(run_dir)
    names = [f"train_data_step{s}.jsonl" for s in range(1, STEPS + 1)]
    # NeMo-RL's step files, and our simulated engine's refit readback (not NeMo-RL's)
    assert sorted(p.name for p in ours_dir.glob("*.jsonl")) == ["refit_readback.jsonl", *names]
    tok = CharTokenizer()
    logger = nemo_rl_logger(tmp_path / "upstream")
    found = {}
    for step, name in enumerate(names, start=1):
        ours = _read(ours_dir / name)
        assert len(ours) == BATCH
        assert [r["idx"] for r in ours] == list(range(BATCH))
        logger.log_batched_dict_as_jsonl(_upstream_log_data(ours, tok), name)
        theirs = _read(tmp_path / "upstream" / name)
        assert len(theirs) == BATCH and theirs[0]["idx"] == 0
        for what, example in _differences(ours, theirs).items():
            found.setdefault(what, f"step {step} {example}")
    assert found == {}, "layout differences from NeMo-RL's logger:\n" + "\n".join(
        f"  {what}: {example}" for what, example in found.items()
    )


def test_nemo_ais_analyze_reads_the_run_logs(run_dir, tmp_path):
    log_dir = _log_dir(run_dir)
    out = tmp_path / "analysis"
    assert main(["analyze", str(log_dir), "--out", str(out)]) == 0
    rows = _read(out / "analysis.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # the loss's token count: token_loss_mask[:, 1:] * sample_loss_mask over the step file
    step1 = _read(log_dir / "train_data_step1.jsonl")
    n_tok = sum(sum(r["token_loss_mask"][0][1:]) * r["sample_loss_mask"][0] for r in step1)
    assert rows[0]["ais/n_tok"] == n_tok > 0
