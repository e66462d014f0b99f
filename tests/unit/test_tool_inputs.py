# SPDX-FileCopyrightText: Copyright (c) 2026, nemo_ais contributors.
# SPDX-License-Identifier: Apache-2.0
"""The tool commands' inputs and outputs: the input-amax file from writer to refit, prompts, --out, Ctrl-C."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from nemo_ais.cli import main
from nemo_ais.refit.config import read_input_amax_file
from nemo_ais.refit.stream import RefitConfig, RefitStream
from nemo_ais.tools.input_amax_file import calibration_batches, check_out_path, read_prompts, write_input_amax

# ----------------------------------------------------------------------------------------- input_amax_file


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", r"cannot read it \(Expecting value"),
        ('{"a": 1.0', r"cannot read it \(Expecting"),
        ("[1.0, 2.0]", r"got a JSON list; expected a JSON object \{module"),
        ('{"model.layers.0.mlp.up_proj": null}', r"'model\.layers\.0\.mlp\.up_proj' is None, expected one finite"),
        ('{"a": "12.5"}', r"'a' is '12\.5', expected one finite number >= 0"),
        ('{"a": NaN}', r"'a' is nan"),
        ('{"a": -1}', r"'a' is -1"),
        ('{"a": true}', r"'a' is True"),
    ],
)
def test_a_bad_input_amax_file_is_refused_naming_the_file(tmp_path, text, problem):
    path = tmp_path / "amax.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^input_amax_file {path}: {problem}"):
        read_input_amax_file(path)


def test_a_missing_or_non_utf8_input_amax_file_names_the_file(tmp_path):
    with pytest.raises(ValueError, match=rf"^input_amax_file {tmp_path / 'nope.json'}: cannot read it"):
        read_input_amax_file(tmp_path / "nope.json")
    (tmp_path / "latin1.json").write_bytes(b'{"caf\xe9": 1.0}')
    with pytest.raises(ValueError, match=r"latin1\.json: cannot read it \('utf-8' codec"):
        read_input_amax_file(tmp_path / "latin1.json")


def test_what_the_writer_writes_the_refit_reads(tmp_path):
    amax = {"model.layers.0.mlp.gate_proj": 12.5, "model.layers.0.mlp.up_proj": 0.0}
    path = write_input_amax(amax, tmp_path / "calibration" / "amax.json")
    assert read_input_amax_file(path) == amax
    assert not list(path.parent.glob("*.partial"))  # written aside, then renamed into place


@pytest.mark.parametrize("value", [None, "12.5", True, float("inf")])
def test_the_stream_refuses_a_bad_input_amax_entry(value):
    with pytest.raises(ValueError, match=r"^input_amax\['m\.up_proj'\]: got "):
        RefitStream(RefitConfig(format="nvfp4_w4a4"), input_amax={"m.up_proj": value})


# ----------------------------------------------------------------------------------------- prompts, --out


def test_prompts_that_are_not_utf8_name_the_flag_and_the_byte(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"first prompt\n\xff\xfe second\n")
    with pytest.raises(ValueError, match=rf"^--prompts {path}: not UTF-8 text \(byte 13: invalid start byte\)"):
        read_prompts(path)


def test_a_utf8_bom_is_not_part_of_the_first_prompt(tmp_path):
    (tmp_path / "p.txt").write_bytes("\ufefffirst\nsecond\n".encode())
    (tmp_path / "p.jsonl").write_bytes('\ufeff{"prompt": "first"}\n'.encode())
    assert read_prompts(tmp_path / "p.txt") == ["first", "second"]
    assert read_prompts(tmp_path / "p.jsonl") == ["first"]


def test_an_unreadable_prompts_file_names_it(tmp_path, monkeypatch):
    path = tmp_path / "p.txt"
    path.write_text("x\n")

    def refuse(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(ValueError, match=rf"^--prompts {path}: cannot read it \(Permission denied\)"):
        read_prompts(path)


def test_out_a_directory_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import nemo_ais.tools.input_amax_file as tool

    monkeypatch.setattr(tool, "load_causal_lm", lambda *a, **k: pytest.fail("loaded the model"))
    with pytest.raises(ValueError, match=rf"^--out {tmp_path}: a directory"):
        check_out_path(tmp_path)
    assert main(["calibrate-input-amax", "any/model", "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path}: a directory" in capsys.readouterr().err


def _bos_tokenizer() -> PreTrainedTokenizerFast:
    """One token a byte, a post-processor that prepends <bos>, and a template that writes <bos> itself."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<bos>", *alphabet])}
    tok = Tokenizer(models.BPE(vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")
    fast.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


def test_the_chat_template_is_tokenized_as_nemo_rl_does_one_bos(tmp_path):
    tokenizer = _bos_tokenizer()
    (ids, _), *_ = calibration_batches(tokenizer, ["hi"], max_length=16, batch_size=1, chat_template=True)
    assert ids.tolist() == [[2, *tokenizer.convert_tokens_to_ids(["h", "i"])]]  # NeMo-RL: add_special_tokens=False
    (plain, _), *_ = calibration_batches(tokenizer, ["hi"], max_length=16, batch_size=1)
    assert plain.tolist() == ids.tolist()  # without a template the tokenizer adds the one <bos>


def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys, tmp_path):
    import nemo_ais.tools.input_amax_file as tool

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tool, "read_prompts", interrupted)
    assert main(["calibrate-input-amax", "any/model", "--out", str(tmp_path / "a.json")]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "nemo-ais calibrate-input-amax: interrupted before its output was complete"


def test_attribute_prints_its_table_before_an_unwritable_out_fails(monkeypatch, capsys, tmp_path):
    import nemo_ais.tools.attribution as attribution

    def unwritable(att, out, **kwargs):
        raise FileExistsError(17, "File exists", str(out))

    monkeypatch.setattr(attribution, "write_attribution", unwritable)
    out = tmp_path / "a_file"
    argv = ["attribute", "--preset", "quick", "--prompts", "2", "--out", str(out), "--no-plot"]
    code = main([*argv, f"policy.warm_start.cache_dir={tmp_path}", "rollout.format=nvfp4_w4a16"])  # random init
    captured = capsys.readouterr()
    assert code == 1
    assert "| layer 0 self_attn.q_proj weights |" in captured.out  # the result is printed, not lost
    assert f"nemo-ais attribute: cannot write {out}: File exists" in captured.err


def test_a_failed_calibration_forward_is_one_line(monkeypatch, capsys, tmp_path):
    import nemo_ais.tools.input_amax_file as tool

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    monkeypatch.setattr(tool, "load_causal_lm", lambda *a, **k: (None, None))
    monkeypatch.setattr(tool, "calibration_batches", lambda *a, **k: iter(()))
    monkeypatch.setattr(tool, "calibrate_input_amax", out_of_memory)
    assert main(["calibrate-input-amax", "any/model", "--out", str(tmp_path / "a.json")]) == 1
    assert capsys.readouterr().err == (
        "nemo-ais calibrate-input-amax: the calibration forward failed: RuntimeError: CUDA out of memory. "
        "Tried to allocate 2.00 GiB\n"
    )
