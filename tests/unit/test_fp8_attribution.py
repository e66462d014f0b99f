# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Mismatch attribution by source (``nemo_ais.tools.attribution``, ``nemo-ais attribute``).

On tiny random-init HF models built offline: a planted bad layer ranks first; quantizing
nothing gives exactly zero mismatch and ``format: bf16`` has no source; quantizing
everything is the twin itself, bit for bit; one module's weights alone equal a twin that
quantizes only that module; the sources per format and KV cache; MoE experts one source
per projection; the CLI on the recipe's policy.
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import tiny_lm, tiny_moe

from nemo_ais.cli import main
from nemo_ais.rollout.twin import RolloutPrecisionConfig, RolloutTwin, logprob_mismatch, score_responses
from nemo_ais.tools.attribution import Source, attribute_mismatch, attribution_markdown, write_attribution

VOCAB = 128
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
W4A4_NVFP4_KV = RolloutPrecisionConfig(format="nvfp4_w4a4", kv_cache="nvfp4")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _tiny(layers=3):
    return tiny_lm(vocab_size=VOCAB, num_hidden_layers=layers)


def _prompts(batch=8, length=12):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4], ids[0, :4] = 0, 0  # left padding
    return ids, mask


def _attribute(model, config, **kw):
    ids, mask = _prompts()
    gen = torch.Generator().manual_seed(0)
    return attribute_mismatch(model, config, ids, mask, max_new_tokens=10, generator=gen, **kw)


@torch.no_grad()
def _plant_bad_layer(model, layer=1, unit=5):
    """Layer ``layer``'s down_proj: x20, plus a 1e6 outlier on an intermediate unit that is
    always 0 (its gate and up rows zeroed), so the BF16 model does not see the outlier
    while NVFP4's global scale (amax / 2688) puts every other block's E4M3 scale at its
    2^-9 floor: that weight quantizes to mostly zeros."""
    mlp = model.model.layers[layer].mlp
    mlp.gate_proj.weight[unit] = 0.0
    mlp.up_proj.weight[unit] = 0.0
    mlp.down_proj.weight.mul_(20.0)
    mlp.down_proj.weight[0, unit] = 1e6
    return model


def test_a_planted_bad_layer_ranks_first():
    att = _attribute(_plant_bad_layer(_tiny()), W4A4_NVFP4_KV)
    planted = Source("weights", 1, "mlp.down_proj")
    first, second = att.rows[0], att.rows[1]
    assert first.sources == (planted,), [r.label for r in att.rows[:3]]
    assert first.alone.mean_abs_delta > 2 * second.alone.mean_abs_delta
    assert max(att.rows, key=lambda r: r.buys).sources == (planted,)  # BF16 there buys most
    layers = [g for g in att.groups if g.group == "layer"]
    modules = [g for g in att.groups if g.group == "module"]
    assert layers[0].label == "layer 1 (all)" and modules[0].label == "mlp.down_proj (all layers)"
    # without the plant the same layer is unremarkable: the ranking comes from the plant
    clean = _attribute(_tiny(), W4A4_NVFP4_KV)
    clean_alone = next(r.alone for r in clean.rows if r.sources == (planted,))
    assert first.alone.mean_abs_delta > 3 * clean_alone.mean_abs_delta
    md = attribution_markdown(att, top=3)
    assert "| layer 1 mlp.down_proj weights |" in md.split("By source")[1].splitlines()[4]


@pytest.mark.parametrize(
    "config",
    [
        W4A4_NVFP4_KV,
        RolloutPrecisionConfig(format="fp8", kv_cache="fp8"),
        RolloutPrecisionConfig(format="mxfp8"),
        RolloutPrecisionConfig(format="nvfp4_w4a16", kv_cache="fp8", attention_in_bf16=True),
        RolloutPrecisionConfig(format="fp8", kv_cache="fp8", error_scale=8.0),  # the dial k on the KV cache too
    ],
    ids=lambda c: f"{c.format}-{c.kv_cache}-k{c.error_scale:g}",
)
def test_nothing_quantized_is_zero_and_everything_is_the_twin(config):
    model, (ids, mask) = _tiny(layers=2), _prompts()
    twin = RolloutTwin(model, config)
    out = twin.generate(ids, mask, max_new_tokens=10, generator=torch.Generator().manual_seed(0))
    resp, rmask = out.response_ids, out.response_mask
    att = attribute_mismatch(model, config, ids, mask, response_ids=resp, response_mask=rmask)
    assert att.none == logprob_mismatch(rmask.float(), rmask.float(), rmask)  # exactly 0
    assert att.none.mean_abs_delta == 0.0 and att.none.n_tok == int(rmask.sum())
    reference = score_responses(model, ids, mask, resp)
    fresh = RolloutTwin(model, config)  # calibrates on the same prompts, as attribution's
    assert att.full == logprob_mismatch(reference, fresh.score(ids, mask, resp), rmask)
    assert att.full.mean_abs_delta > 1e-4
    kinds = {s.kind for r in att.rows for s in r.sources}
    expected = {"weights"}
    expected |= {"activations"} if config.format != "nvfp4_w4a16" else set()
    expected |= {"kv_cache"} if config.kv_cache != "bf16" else set()
    assert kinds == expected
    modules = {s.module for r in att.rows for s in r.sources if s.kind == "weights"}
    kept = {"self_attn." + p for p in PROJ[:4]} if config.attention_in_bf16 else set()
    assert modules == {f"{'self_attn' if p in PROJ[:4] else 'mlp'}.{p}" for p in PROJ} - kept
    # every source's kept-in-BF16 and alone mismatches are finite and nonnegative
    assert all(0.0 <= r.alone.mean_abs_delta < 10 for r in (*att.rows, *att.groups))


def test_bf16_format_has_no_source_and_zero_mismatch():
    att = _attribute(_tiny(layers=2), RolloutPrecisionConfig(format="bf16"))
    assert att.rows == () and att.groups == ()
    assert att.full.mean_abs_delta == 0.0 == att.none.mean_abs_delta
    kv_only = _attribute(_tiny(layers=2), RolloutPrecisionConfig(format="bf16", kv_cache="fp8"))
    assert [r.sources for r in kv_only.rows] in (
        [(Source("kv_cache", 0, "kv_cache"),), (Source("kv_cache", 1, "kv_cache"),)],
        [(Source("kv_cache", 1, "kv_cache"),), (Source("kv_cache", 0, "kv_cache"),)],
    )
    assert kv_only.full.mean_abs_delta > 0.0


def test_one_weight_alone_equals_a_twin_quantizing_only_that_module():
    """W4A16 (weights only), down_proj (no fused shards): M({W}) == a twin of just it."""
    model, (ids, mask) = _tiny(layers=2), _prompts()
    config = RolloutPrecisionConfig(format="nvfp4_w4a16")
    att = _attribute(model, config)
    row = next(r for r in att.rows if r.sources == (Source("weights", 1, "mlp.down_proj"),))
    only = RolloutPrecisionConfig(format="nvfp4_w4a16", keep_patterns=[r"^(?!model\.layers\.1\.mlp\.down_proj$).*$"])
    twin = RolloutTwin(model, only)
    assert twin.quantized_module_names == ("model.layers.1.mlp.down_proj",)
    out = RolloutTwin(model, config).generate(ids, mask, max_new_tokens=10, generator=torch.Generator().manual_seed(0))
    expected = logprob_mismatch(
        score_responses(model, ids, mask, out.response_ids), twin.score(ids, mask, out.response_ids), out.response_mask
    )
    assert row.alone == expected


def test_moe_experts_are_one_source_per_projection():
    model = tiny_moe()
    ids = torch.randint(4, 256, (4, 8), generator=torch.Generator().manual_seed(2))
    config = RolloutPrecisionConfig(format="nvfp4_w4a16")
    att = attribute_mismatch(
        model, config, ids, torch.ones_like(ids), max_new_tokens=4,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    modules = {s.module for r in att.rows for s in r.sources}
    assert {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"} <= modules
    assert "mlp.gate" not in modules  # the router stays unquantized
    assert att.none.mean_abs_delta == 0.0 < att.full.mean_abs_delta
    experts = next(r for r in att.rows if r.sources[0].module == "mlp.experts.down_proj")
    assert experts.alone.mean_abs_delta > 0.0


def test_write_attribution_and_the_cli(tmp_path, capsys, monkeypatch):
    att = _attribute(_tiny(layers=2), W4A4_NVFP4_KV)
    written = write_attribution(att, tmp_path / "lib", top=4)
    assert [p.name for p in written] == ["attribution.md", "attribution.json", "attribution.png"]
    assert all(p.stat().st_size > 0 for p in written)
    rows = json.loads(written[1].read_text())["rows"]
    assert rows[0]["label"] == "all quantized" and len(rows) == 1 + len(att.groups) + len(att.rows)
    # the CLI on the recipe's policy (no warm-start cache here: the random init), 4 prompts
    argv = ["attribute", "--preset", "quick", "--prompts", "4", "--no-plot"]
    argv += ["--out", str(tmp_path / "cli"), f"policy.warm_start.cache_dir={tmp_path}"]
    assert main([*argv, "rollout.format=nvfp4_w4a16", "rollout.kv_cache=bf16"]) == 0
    printed = capsys.readouterr().out
    assert "format nvfp4_w4a16, KV cache bf16" in printed and "random init" in printed
    assert "| layer 0 self_attn.q_proj weights |" in (tmp_path / "cli/attribution.md").read_text()
    assert main(["attribute", "--preset", "quick", "--prompts", "33"]) == 2  # eval_size 32
    assert "--prompts 33 is invalid: expected at most data.eval_size=32" in capsys.readouterr().err
    asked = []  # the default: as many held-out prompts as the preset has, at most 64

    def stop(cfg, num_prompts, **kwargs):
        asked.append(num_prompts)
        raise ValueError("stopped before the model is built")

    monkeypatch.setattr("nemo_ais.embedded.twin_setup.twin_setup", stop)
    assert main(["attribute", "--preset", "quick"]) == 2
    assert main(["attribute", "--preset", "default"]) == 2
    assert asked == [32, 64] and "stopped before" in capsys.readouterr().err
    monkeypatch.undo()
    for flag in ("--prompts", "--top"):
        with pytest.raises(SystemExit, match="2"):
            main(["attribute", "--preset", "quick", flag, "0"])
        assert f"{flag}: got '0', expected an integer >= 1" in capsys.readouterr().err
    assert main(["attribute", "--preset", "quick", "rollout.format=fp4"]) == 2
    assert "rollout.format='fp4' is invalid" in capsys.readouterr().err
    assert main(["attribute", "--preset", "quick", "--arm", "nope"]) == 2


def test_an_arm_with_its_own_reward_is_attributed_from_the_runs_warm_start(tmp_path):
    from nemo_ais.embedded.config import CONFIG_DIR, load_config, resolve_arm
    from nemo_ais.embedded.twin_setup import twin_setup
    from nemo_ais.embedded.warmstart import build_task, warm_start, warm_start_path

    tiny = ["policy.warm_start.steps=2", "policy.warm_start.batch_size=4", f"policy.warm_start.cache_dir={tmp_path}"]
    raw = load_config(CONFIG_DIR / "quick.yaml", [*tiny, "experiment.arms.fp8-ais.data.reward=prefix"])
    base, arm = resolve_arm(raw, None), resolve_arm(raw, "fp8-ais")
    trained = warm_start(base, build_task(base), progress=False)  # what nemo-ais run trains, for every arm
    assert warm_start_path(arm) != trained  # the arm's own key: not the file the run trained
    assert twin_setup(arm, 4, warm_start_cfg=base).warm_started
    assert not twin_setup(arm, 4).warm_started  # without it: the random init, silently


def test_a_failed_write_keeps_the_previous_complete_set_and_no_plot_drops_an_old_one(tmp_path, monkeypatch):
    import nemo_ais.tools.attribution as attribution

    att = _attribute(_tiny(layers=2), W4A4_NVFP4_KV)
    out = tmp_path / "att"
    before = {p.name: p.read_bytes() for p in write_attribution(att, out, top=4)}

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(attribution, "plot_attribution", full_disk)  # after the text files are written
    with pytest.raises(OSError, match="No space left"):
        write_attribution(att, out, top=4)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old set, whole; no .partial
    monkeypatch.undo()
    written = write_attribution(att, out, top=4, plot=False)
    assert (
        sorted(p.name for p in out.iterdir())
        == sorted(p.name for p in written)
        == ["attribution.json", "attribution.md"]
    )


def test_attribution_json_is_strict_json_with_null_for_a_non_finite_value(tmp_path):
    att = _attribute(_tiny(layers=2), W4A4_NVFP4_KV)
    att = att._replace(full=att.full._replace(gen_kl_error=float("inf"), max_abs_delta=float("nan")))
    written = write_attribution(att, tmp_path, plot=False)

    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    rows = json.loads(written[1].read_text(), parse_constant=refuse)["rows"]
    assert rows[0]["label"] == "all quantized"
    assert rows[0]["alone"]["gen_kl_error"] is None and rows[0]["alone"]["max_abs_delta"] is None
    assert rows[0]["alone"]["mean_abs_delta"] == att.full.mean_abs_delta  # finite values unchanged
