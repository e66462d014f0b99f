# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""``nemo-ais calibrate-input-amax``: the W4A4 refit's input_amax_file from a BF16 checkpoint.

A tiny random-init Qwen2 and a word-level tokenizer, both saved to a temporary HF
directory (no download). The file must equal an independent float64 oracle, agree with
the W4A4 twin's trainer-side calibration, and drive the refit stream's ``input_scale``.
"""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import tiny_lm, tiny_per_expert_moe
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from torch import nn
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from nemo_ais.cli import main
from nemo_ais.nemo_rl.refit import _input_amax
from nemo_ais.refit.stream import BlockSyncConfig, block_weight_stream
from nemo_ais.rollout.config import RolloutPrecisionConfig
from nemo_ais.rollout.twin import RolloutTwin
from nemo_ais.tools.input_amax_file import (
    calibrate_input_amax,
    calibration_batches,
    load_causal_lm,
    read_prompts,
    write_input_amax,
)

PROMPTS = [
    "solve for x : 3 x + 7 = 22",
    "find the sum of all divisors of 360 and then the sum of their squares",
    "what is 7 times 8",
    "a train travels 180 km in 2 hours what is its speed",
    "prove that 2 has no rational square root",
    "list the first ten primes",
    "x",
]
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_LENGTH = 40  # bytes: the second (69) and fourth (51) prompts are truncated
BATCH = 3  # 7 prompts: batches of 3, 3, 1 (uneven left padding)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges (one token a byte): what a Qwen2 checkpoint's
    tokenizer class rebuilds unchanged on load (transformers 5 maps qwen2 to it)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", *alphabet])}
    tok = Tokenizer(models.BPE(vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _tiny_qwen(seed: int = 0) -> torch.nn.Module:
    return tiny_lm(seed=seed, vocab_size=272)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A saved float32 tiny Qwen2 + tokenizer: ``(dir, model, tokenizer as loaded back)``."""
    path = tmp_path_factory.mktemp("tiny_qwen2")
    model = _tiny_qwen()
    model.save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path, model, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [json.dumps({"prompt": p, "answer": "-"}) for p in PROMPTS[:-1]]
    path.write_text("\n".join([*rows, "", json.dumps(PROMPTS[-1])]) + "\n")  # blank line skipped
    return path


@pytest.fixture(scope="module")
def written(checkpoint, prompts_file, tmp_path_factory):
    """The CLI's JSON for the checkpoint (float32, so the oracle sees the same activations)."""
    out = tmp_path_factory.mktemp("calib") / "sub" / "input_amax.json"
    argv = [
        "calibrate-input-amax",
        str(checkpoint[0]),
        "--out",
        str(out),
        "--prompts",
        str(prompts_file),
        "--max-length",
        str(MAX_LENGTH),
        "--batch-size",
        str(BATCH),
        "--dtype",
        "float32",
    ]
    assert main(argv) == 0
    return json.loads(out.read_text())


def _oracle_batches(tokenizer, prompts, max_length, batch):
    """Each prompt tokenized alone, cut to ``max_length``, left-padded by hand."""
    ids = [tokenizer(p)["input_ids"][:max_length] for p in prompts]
    pad = tokenizer.pad_token_id
    for start in range(0, len(ids), batch):
        rows = ids[start : start + batch]
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        yield input_ids, mask


def _oracle_amax(model, batches) -> dict[str, float]:
    """max |x| in float64 over the valid tokens of each decoder linear's input."""
    seen: dict[str, float] = {}
    current = {}

    def hook(name):
        def record(_module, inputs, _output):
            x = inputs[0].double()[current["mask"].bool()]
            seen[name] = max(seen.get(name, 0.0), x.abs().max().item())

        return record

    handles = [
        m.register_forward_hook(hook(n))
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and ".layers." in n
    ]
    with torch.no_grad():
        for input_ids, mask in batches:
            current["mask"] = mask
            model(input_ids=input_ids, attention_mask=mask, position_ids=mask.cumsum(-1) - 1)
    for h in handles:
        h.remove()
    return seen


def test_file_equals_float64_oracle(checkpoint, written):
    _, model, tokenizer = checkpoint
    expected = _oracle_amax(model, _oracle_batches(tokenizer, PROMPTS, MAX_LENGTH, BATCH))
    names = [f"model.layers.{i}.{blk}.{p}" for i in range(2) for blk, p in _blocks()]
    assert list(written) == names  # every decoder linear, in model order
    # same batches, same float32 forward: the fp32 max is exact in float64
    mismatched = {n: (written[n], expected[n]) for n in names if written[n] != expected[n]}
    assert not mismatched, f"first mismatch (file, oracle): {next(iter(mismatched.items()))}"


def _blocks():
    attn = [("self_attn", p) for p in PROJ[:4]]
    return attn + [("mlp", p) for p in PROJ[4:]]


def test_padding_does_not_leak_into_amax(checkpoint, written):
    """One prompt at a time, unpadded: padded rows were masked out of the max.

    Tolerance: left padding may change only the float32 attention/GEMM summation order
    (0 difference observed here; rel 1e-5 leaves room for other BLAS builds); a leaked pad
    row would move the max by O(1).
    """
    _, model, tokenizer = checkpoint
    alone = _oracle_amax(model, _oracle_batches(tokenizer, PROMPTS, MAX_LENGTH, 1))
    for name, value in written.items():
        assert value == pytest.approx(alone[name], rel=1e-5, abs=0), name


def test_per_expert_linears_share_their_projection_max_without_padding():
    """Per-expert linears (``mlp.experts.<e>.gate_proj``): every expert of a layer's projection takes the max over the
    experts that saw a row, so an expert no calibration token reaches (expert 3: never routed) still gets an amax;
    and no padding reaches an expert's input (the pad token's one-hot embedding would give ``sqrt(64) = 8`` after
    the RMSNorm). Oracle: float64 hooks over each prompt alone, unpadded, grouped by projection by hand."""
    model, tokenizer = tiny_per_expert_moe(), _tokenizer()
    with torch.no_grad():
        model.model.embed_tokens.weight[tokenizer.pad_token_id] = 0.0
        model.model.embed_tokens.weight[tokenizer.pad_token_id, 5] = 50.0
    got = calibrate_input_amax(model, calibration_batches(tokenizer, PROMPTS, max_length=MAX_LENGTH, batch_size=BATCH))
    seen: dict[str, float] = {}

    def hook(name):
        def record(_module, inputs):
            seen[name] = max(seen.get(name, 0.0), inputs[0].double().abs().max().item())

        return record

    experts = {n: m for n, m in model.named_modules() if ".experts." in n and isinstance(m, nn.Linear)}
    handles = [m.register_forward_pre_hook(hook(n)) for n, m in experts.items()]
    with torch.no_grad():
        for input_ids, _ in _oracle_batches(tokenizer, PROMPTS, MAX_LENGTH, 1):
            model(input_ids=input_ids, position_ids=torch.arange(input_ids.shape[1])[None])
    for h in handles:
        h.remove()
    assert not any(".experts.3." in n for n in seen)  # never routed
    for name in experts:
        layer, proj = name.split(".mlp.experts.")[0], name.rsplit(".", 1)[1]
        expected = max(v for n, v in seen.items() if n.startswith(f"{layer}.mlp.experts.") and n.endswith(proj))
        assert got[name] == expected < 8.0 / 2, name


def test_twin_w4a4_calibration_agrees(checkpoint):
    """The twin's trainer-side W4A4 calibration and the file agree bit for bit."""
    _, model, tokenizer = checkpoint
    (ids, mask), *_ = calibration_batches(tokenizer, PROMPTS, max_length=MAX_LENGTH, batch_size=7)
    ours = calibrate_input_amax(model, iter([(ids, mask)]))
    twin = RolloutTwin(model, RolloutPrecisionConfig(format="nvfp4_w4a4"))
    theirs = twin.calibrate_input_amax(ids, mask, model=model)
    assert ours == {n: float(a) for n, a in theirs.items()}
    assert not hasattr(model.model.layers[0].mlp.up_proj, "calibrating")  # model untouched


def test_refit_stream_input_scale_from_file(checkpoint, written, tmp_path):
    """input_amax_file -> the refit hook's reader -> BlockWeightStream: input_scale per module."""
    _, model, _ = checkpoint
    path = tmp_path / "amax.json"
    path.write_text(json.dumps(written))
    config = BlockSyncConfig(format="nvfp4_w4a4", input_amax_file=str(path))
    out = dict(block_weight_stream(model.state_dict().items(), config, input_amax=_input_amax(config)))
    fused = {"q_proj": ("q_proj", "k_proj", "v_proj"), "gate_proj": ("gate_proj", "up_proj")}
    fused |= {"k_proj": fused["q_proj"], "v_proj": fused["q_proj"], "up_proj": fused["gate_proj"]}
    n_checked = 0
    for i in range(2):
        for blk, proj in _blocks():
            prefix = f"model.layers.{i}.{blk}."
            members = fused.get(proj, (proj,))
            amax = max(written[prefix + p] for p in members)  # fused: max over the shards
            expected = torch.tensor(amax, dtype=torch.float32) / torch.tensor(6 * 448, dtype=torch.float32)
            got = out[f"{prefix}{proj}.input_scale"]
            assert got.dtype == torch.float32 and got.shape == ()
            assert torch.equal(got, expected), (prefix + proj, got.item(), expected.item())
            n_checked += 1
    assert n_checked == 14
    assert "lm_head.input_scale" not in out and out["lm_head.weight"].dtype == torch.float32


def test_bf16_checkpoint_via_cli(checkpoint, prompts_file, tmp_path):
    """The default dtype (bfloat16, the trainer's checkpoint) against the oracle, exact."""
    out = tmp_path / "bf16.json"
    argv = ["calibrate-input-amax", str(checkpoint[0]), "--out", str(out)]
    assert main([*argv, "--prompts", str(prompts_file), "--num-samples", "4"]) == 0
    got = json.loads(out.read_text())
    model, tokenizer = load_causal_lm(str(checkpoint[0]))  # as the CLI loads it
    assert model.dtype == torch.bfloat16
    expected = _oracle_amax(model, _oracle_batches(tokenizer, PROMPTS[:4], 2048, 8))
    assert got == expected


# --------------------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--num-samples", "0"], "--num-samples"),
        (["--max-length", "-3"], "--max-length"),
        (["--batch-size", "two"], "--batch-size"),
        (["--device", "tpu"], "--device"),
        (["--dtype", "float16"], "--dtype"),
    ],
)
def test_bad_cli_arguments_name_the_flag(checkpoint, tmp_path, capsys, extra, match):
    argv = ["calibrate-input-amax", str(checkpoint[0]), "--out", str(tmp_path / "a.json")]
    with pytest.raises(SystemExit) as exc:
        main([*argv, *extra])
    assert exc.value.code == 2
    assert match in capsys.readouterr().err


def test_missing_out_is_refused(checkpoint, capsys):
    with pytest.raises(SystemExit):
        main(["calibrate-input-amax", str(checkpoint[0])])
    assert "--out" in capsys.readouterr().err


def _run(argv, capsys):
    code = main(argv)
    return code, capsys.readouterr().err


def test_bad_prompts_and_model_name_the_argument(checkpoint, tmp_path, capsys):
    out = ["--out", str(tmp_path / "a.json")]
    model = str(checkpoint[0])
    code, err = _run(["calibrate-input-amax", model, *out, "--prompts", "nope.jsonl"], capsys)
    assert code == 2 and "--prompts nope.jsonl: no such file" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n{"question": "y"}\n')
    code, err = _run(["calibrate-input-amax", model, *out, "--prompts", str(bad)], capsys)
    assert code == 2 and "line 2" in err and "'prompt' (--prompt-key)" in err
    empty_dir = tmp_path / "empty_model"
    empty_dir.mkdir()
    code, err = _run(["calibrate-input-amax", str(empty_dir), *out], capsys)
    assert code == 2 and "MODEL" in err and str(empty_dir) in err
    code, err = _run(["calibrate-input-amax", str(tmp_path / "no_such_model"), *out], capsys)
    assert code == 2 and f"MODEL '{tmp_path / 'no_such_model'}': no such directory" in err
    assert not (tmp_path / "a.json").exists()


def _broken_copy(checkpoint, tmp_path, name, edit):
    """A copy of the checkpoint with ``edit(directory)`` applied."""
    path = tmp_path / name
    shutil.copytree(checkpoint[0], path)
    edit(path)
    return str(path)


def _drop_layer_1(path):
    weights = load_file(path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".layers.1." not in k}, path / "model.safetensors")


def test_a_checkpoint_that_cannot_be_read_whole_is_refused_naming_model(checkpoint, tmp_path, capsys):
    """No silent random init of a missing weight; a corrupt file or missing tokenizer is one line, exit 2."""
    out = ["--out", str(tmp_path / "a.json"), "--dtype", "float32"]
    safetensors = "model.safetensors"
    cases = [
        ("partial", _drop_layer_1, r"weight\(s\) missing from the checkpoint \(e\.g\. \['model\.layers\.1\."),
        ("corrupt", lambda p: (p / safetensors).write_bytes((p / safetensors).read_bytes()[:1000]), "cannot load"),
        ("truncated", lambda p: (p / safetensors).write_bytes((p / safetensors).read_bytes()[:-5000]), "cannot load"),
        ("no_tokenizer", lambda p: [f.unlink() for f in p.glob("*token*")], "no tokenizer files in it"),
    ]
    for name, edit, match in cases:
        model = _broken_copy(checkpoint, tmp_path, name, edit)
        code, err = _run(["calibrate-input-amax", model, *out], capsys)
        assert code == 2 and re.search(rf"MODEL '{re.escape(model)}': .*{match}", err), (name, err)
        assert "Traceback" not in err
    assert not (tmp_path / "a.json").exists()


def test_prompts_are_lines_of_a_jsonl_or_txt_file_only(tmp_path):
    """Split on newlines only (U+2028 and U+0085 are inside a JSON string or a line); another suffix is refused."""
    rows = ["first\u2028still first", "second\u0085still second"]
    jsonl, txt = tmp_path / "p.jsonl", tmp_path / "p.txt"
    jsonl.write_text("".join(json.dumps({"prompt": r}, ensure_ascii=False) + "\r\n" for r in rows), encoding="utf-8")
    txt.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    assert read_prompts(jsonl) == read_prompts(txt) == rows
    as_json = tmp_path / "p.json"
    as_json.write_text(json.dumps([{"prompt": r} for r in rows]))
    with pytest.raises(ValueError, match=r"--prompts .*p\.json: expected a \.jsonl file .* or a \.txt file"):
        read_prompts(as_json)


def test_cuda_without_cuda_names_device(checkpoint, tmp_path, capsys, monkeypatch):
    # CUDA is hidden from the code path in-process, so this holds on any host (issue 27)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["calibrate-input-amax", str(checkpoint[0]), "--out", str(tmp_path / "a.json")]
    code, err = _run([*argv, "--device", "cuda"], capsys)
    assert code == 2 and "--device cuda" in err


def test_library_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="num_samples"):
        read_prompts(None, num_samples=0)
    with pytest.raises(ValueError, match="max_length"):
        calibration_batches(_tokenizer(), PROMPTS, max_length=0, batch_size=1)
    with pytest.raises(ValueError, match="no calibration batch"):
        calibrate_input_amax(_tiny_qwen(), iter([]))
    with pytest.raises(ValueError, match="finite"):
        write_input_amax({"model.layers.0.mlp.up_proj": float("nan")}, tmp_path / "a.json")
    assert read_prompts(None, num_samples=3) == read_prompts(None)[:3]
