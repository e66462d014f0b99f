# Copyright (c) 2026, nemo_ais contributors. SPDX-License-Identifier: Apache-2.0
"""Every validator of ``CorrectionConfig`` and ``PGLossConfig``, through ``validate_section``.

Each invalid case asserts that ONE ``ValueError`` is raised and that its message names the
full dotted path of the offending field (``loss_fn.ais.<field>`` / ``loss_fn.<field>``) and
the value that arrived. A coverage test checks that every model field has at least one
invalid case here, so a new field without a validator test fails CI.
"""

from __future__ import annotations

import math
import re

import pydantic
import pytest

from nemo_ais.config import CorrectionConfig, PGLossConfig, validate_section

AIS_PATH = "loss_fn.ais"
PG_PATH = "loss_fn"

# (field, bad value, fragment of the reason). The reason fragments are pydantic's wording
# after validate_section's rewrite ("Input should be" -> "expected"). A dotted field is a
# mode's sub-section knob (``icepop.min`` is ``{"icepop": {"min": ...}}``).
CORRECTION_BAD = [
    # mode: Literal choices
    (
        "mode",
        "foo",
        "expected 'none', 'tis', 'icepop', 'seq_mask_geo', 'ais', 'seq_tis', 'seq_mis', 'kl_rs', 'm2po' or 'tbpo'",
    ),
    ("mode", None, "expected 'none'"),
    ("mode", "AIS", "expected 'none'"),  # choices are case-sensitive
    # weight_cap: C > 1 (C <= 1 removes up-weighting)
    ("weight_cap", 1.0, "greater than 1"),
    ("weight_cap", 0.8, "greater than 1"),
    ("weight_cap", -2.0, "greater than 1"),
    ("weight_cap", math.nan, "finite number"),  # strict + allow_inf_nan=False
    ("weight_cap", math.inf, "finite number"),
    # float32 overflow at the loss' clamp was torch's "cannot be converted to type float"
    ("weight_cap", 1e39, "less than or equal to 1000000"),
    ("seq_weight_cap", 1e7, "less than or equal to 1000000"),
    ("weight_cap", "3", "valid number"),  # no string coercion (strict)
    ("severity_scale", math.inf, "finite number"),
    ("alpha_min", True, "valid number"),  # a bool is not a float (strict)
    ("use_severity_gate", 1, "valid boolean"),
    ("weight_cap", "x", "valid number"),
    ("weight_cap", [2.0], "valid number"),
    # tis.floor: None or [0, 1)
    ("tis.floor", 1.0, "less than 1"),
    ("tis.floor", -0.1, "greater than or equal to 0"),
    ("tis.floor", "low", "valid number"),
    # icepop / seq_mask_geo bounds: > 0 each
    ("icepop.min", 0.0, "greater than 0"),
    ("icepop.min", -1.0, "greater than 0"),
    ("icepop.max", 0.0, "greater than 0"),
    ("icepop.max", "hi", "valid number"),
    ("seq_mask_geo.min", 0.0, "greater than 0"),
    ("seq_mask_geo.max", -1.0, "greater than 0"),
    ("seq_mask_geo.max", None, "valid number"),
    # seq_weight: Literal
    ("seq_weight", "arithmetic", "expected 'geometric' or 'product'"),
    # log_ratio_clamp: (0, 80] (float32 exp overflows above ~88.7)
    ("log_ratio_clamp", 0.0, "greater than 0"),
    ("log_ratio_clamp", -1.0, "greater than 0"),
    ("log_ratio_clamp", 80.5, "less than or equal to 80"),
    ("log_ratio_clamp", 1e9, "less than or equal to 80"),
    # severity_scale tau > 0, reliability_floor r_min in [0, 1), variance_tolerance kappa > 0
    ("severity_scale", 0.0, "greater than 0"),
    ("severity_scale", -0.02, "greater than 0"),
    ("reliability_floor", 1.0, "less than 1"),
    ("reliability_floor", -0.5, "greater than or equal to 0"),
    ("variance_tolerance", 0.0, "greater than 0"),
    ("variance_tolerance", "big", "valid number"),
    # mixer: Literal; constant_alpha in [0, 1]
    ("mixer", "sum", "expected 'product' or 'constant'"),
    ("constant_alpha", 1.5, "less than or equal to 1"),
    ("constant_alpha", -0.1, "greater than or equal to 0"),
    # gate switches: booleans
    ("use_severity_gate", "maybe", "valid boolean"),
    ("use_reliability_gate", "sometimes", "valid boolean"),
    ("use_variance_gate", 2, "valid boolean"),
    # EMA beta in [0, 1)
    ("ema", 1.0, "less than 1"),
    ("ema", 1.5, "less than 1"),
    ("ema", -0.1, "greater than or equal to 0"),
    ("ema", None, "valid number"),
    # alpha clamp bounds in [0, 1]
    ("alpha_min", -0.1, "greater than or equal to 0"),
    ("alpha_min", 1.1, "less than or equal to 1"),
    ("alpha_max", -0.1, "greater than or equal to 0"),
    ("alpha_max", 1.1, "less than or equal to 1"),
    # sequence IS / rejection (issue 17): C_seq > 1, bounds > 0
    ("seq_weight_cap", 1.0, "greater than 1"),
    ("seq_weight_cap", math.nan, "finite number"),
    ("seq_mis.min", 0.0, "greater than 0"),
    ("seq_mis.max", -2.0, "greater than 0"),
    # kl_rs: Literal estimator / aggregation, threshold > 0, veto ratio None or in (0, 1)
    ("kl_rs.estimator", "k4", "expected 'k1', 'k2' or 'k3'"),
    ("kl_rs.aggregation", "sum", "expected 'mean' or 'max'"),
    ("kl_rs.threshold", 0.0, "greater than 0"),
    ("kl_rs.threshold", "small", "valid number"),
    ("kl_rs.veto_min_ratio", 0.0, "greater than 0"),
    ("kl_rs.veto_min_ratio", 1.0, "less than 1"),
    # m2po: tau > 0
    ("m2po.tau", 0.0, "greater than 0"),
    ("m2po.tau", math.inf, "finite number"),
    # tbpo trust band: lows in (0, 1), highs > 0
    ("tbpo.clip_low", 0.0, "greater than 0"),
    ("tbpo.clip_low", 1.0, "less than 1"),
    ("tbpo.clip_high", -4e-4, "greater than 0"),
    ("tbpo.clip_high", 1e39, "expected a float32 value, at most 3.4028235e+38"),
    ("tbpo.neg_clip_high", 1e39, "expected a float32 value, at most 3.4028235e+38"),
    ("tbpo.neg_clip_low", 1.5, "less than 1"),
    ("tbpo.neg_clip_high", 0.0, "greater than 0"),
    # switches: booleans
    ("batch_normalize", "yes", "valid boolean"),
    ("bypass", 1, "valid boolean"),
]

FLOAT32_BOUNDED = (
    "ratio_clip_max",
    "ratio_clip_c",
    "reference_policy_kl_penalty",
    "kl_input_clamp_value",
    "kl_output_clamp_value",
    "positive_example_nll_weight",
)
PG_BAD = [
    ("ratio_clip_min", 1.0, "less than 1"),
    ("ratio_clip_min", -0.1, "greater than or equal to 0"),
    ("ratio_clip_min", "eps", "valid number"),
    ("ratio_clip_max", -0.1, "greater than or equal to 0"),
    # finite but beyond float32: the loss's clamp bounds would overflow in torch (or give 0 * inf = NaN)
    *((f, 1e39, "expected a float32 value, at most 3.4028235e+38") for f in FLOAT32_BOUNDED),
    ("ratio_clip_c", 1.0, "greater than 1"),
    ("ratio_clip_c", 0.5, "greater than 1"),
    ("reference_policy_kl_penalty", -0.01, "greater than or equal to 0"),
    ("reference_policy_kl_type", "k4", "expected 'k1', 'k2' or 'k3'"),
    ("kl_input_clamp_value", 0.0, "greater than 0"),
    ("kl_output_clamp_value", -1.0, "greater than 0"),
    ("token_level_loss", "maybe", "valid boolean"),
    ("disable_ppo_ratio", "x", "valid boolean"),
    ("use_cispo", 1, "valid boolean"),
    ("sequence_level_importance_ratios", "yes", "valid boolean"),
    ("use_on_policy_kl_approximation", "on", "valid boolean"),
    ("positive_example_nll_weight", -0.1, "greater than or equal to 0"),
    ("positive_example_nll_weight", math.nan, "finite number"),
]


def _case_id(case):
    field, value, _ = case
    return f"{field}={value!r}"


def _nested(field: str, value) -> dict:
    """``{"icepop": {"min": value}}`` for ``icepop.min``; ``{field: value}`` for a flat one."""
    head, _, leaf = field.partition(".")
    return {head: {leaf: value}} if leaf else {head: value}


def _description(model, field: str) -> str:
    head, _, leaf = field.partition(".")
    info = model.model_fields[head]
    return info.annotation.model_fields[leaf].description if leaf else info.description


def _all_fields(model) -> set[str]:
    """Every leaf field, a sub-section's as ``section.field``."""
    out = set()
    for name, info in model.model_fields.items():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, pydantic.BaseModel):
            out |= {f"{name}.{leaf}" for leaf in sub.model_fields}
        else:
            out.add(name)
    return out


@pytest.mark.parametrize("case", CORRECTION_BAD, ids=_case_id)
def test_correction_field_rejected_with_full_path(case):
    field, value, reason = case
    with pytest.raises(ValueError, match=field) as info:
        validate_section(CorrectionConfig, _nested(field, value), AIS_PATH)
    msg = str(info.value)
    # Exactly one problem reported, on the offending field, with its full path and value.
    assert msg.count("\n") == 0, msg
    assert msg.startswith(f"{AIS_PATH}.{field}={value!r} is invalid: "), msg
    assert reason in msg, msg
    # The hint is the field's description (what the constant means).
    assert _description(CorrectionConfig, field) in msg, msg


@pytest.mark.parametrize("case", PG_BAD, ids=_case_id)
def test_pg_field_rejected_with_full_path(case):
    field, value, reason = case
    with pytest.raises(ValueError, match=field) as info:
        validate_section(PGLossConfig, {field: value}, PG_PATH)
    msg = str(info.value)
    assert msg.startswith(f"{PG_PATH}.{field}={value!r} is invalid: "), msg
    assert reason in msg, msg
    assert PGLossConfig.model_fields[field].description in msg, msg


@pytest.mark.parametrize(
    ("model", "bad", "path"),
    [(CorrectionConfig, CORRECTION_BAD, AIS_PATH), (PGLossConfig, PG_BAD, PG_PATH)],
    ids=["CorrectionConfig", "PGLossConfig"],
)
def test_every_field_has_an_invalid_case(model, bad, path):
    covered = {field for field, _, _ in bad}
    assert covered == _all_fields(model), (
        f"fields of {model.__name__} without a validator test: {sorted(_all_fields(model) - covered)}"
    )


# ---- cross-field rules (model_validator) -------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "expected"),
    [
        # lo > hi and lo == hi: the kept interval [lo, hi] is empty
        ({"icepop": {"min": 2.0, "max": 1.0}}, "icepop.min", "loss_fn.ais.icepop.min=2.0 must be < max=1.0"),
        ({"icepop": {"min": 1.0, "max": 1.0}}, "icepop.min", "loss_fn.ais.icepop.min=1.0 must be < max=1.0"),
        # only one side given: checked against the other side's default (5.0)
        ({"icepop": {"min": 6.0}}, "icepop.min", "loss_fn.ais.icepop.min=6.0 must be < max=5.0"),
        ({"seq_mask_geo": {"min": 1.01}}, "seq_mask_geo.min", "loss_fn.ais.seq_mask_geo.min=1.01 must be < max=1.002"),
        (
            {"seq_mask_geo": {"min": 1.0, "max": 0.9}},
            "seq_mask_geo.min",
            "loss_fn.ais.seq_mask_geo.min=1.0 must be < max=0.9",
        ),
        ({"seq_mis": {"max": 0.4}}, "seq_mis.min", "loss_fn.ais.seq_mis.min=0.5 must be < max=0.4"),
        ({"alpha_min": 0.6, "alpha_max": 0.5}, "alpha_min", "loss_fn.ais.alpha_min=0.6 must be <= alpha_max=0.5"),
        ({"alpha_max": 0.0, "alpha_min": 0.1}, "alpha_min", "alpha_min=0.1 must be <= alpha_max=0.0"),
    ],
)
def test_cross_field_rules(data, field, expected):
    with pytest.raises(ValueError, match=field) as info:
        validate_section(CorrectionConfig, data, AIS_PATH)
    assert expected in str(info.value)
    assert str(info.value).startswith(f"{AIS_PATH}.{field}=")


def test_cross_field_rules_keep_asymmetric_and_equal_bounds():
    # Asymmetric intervals around 1 are allowed (the method doc asks to test them) and
    # alpha_min == alpha_max pins alpha.
    cfg = validate_section(
        CorrectionConfig,
        {
            "icepop": {"min": 0.9, "max": 3.0},
            "seq_mask_geo": {"min": 0.5, "max": 1.0001},
            "alpha_min": 0.3,
            "alpha_max": 0.3,
        },
        AIS_PATH,
    )
    assert (cfg.icepop.min, cfg.icepop.max) == (0.9, 3.0)
    assert (cfg.seq_mask_geo.min, cfg.seq_mask_geo.max) == (0.5, 1.0001)
    assert cfg.alpha_min == cfg.alpha_max == 0.3


# ---- unknown keys, several problems at once -------------------------------------------


def test_unknown_key_names_path_and_allowed_fields():
    with pytest.raises(ValueError, match="weight_capp") as info:
        validate_section(CorrectionConfig, {"weight_capp": 3.0}, AIS_PATH)
    msg = str(info.value)
    assert msg.startswith("loss_fn.ais.weight_capp is not a known field (allowed: ")
    allowed = re.search(r"\(allowed: (.*)\)$", msg).group(1).split(", ")
    assert allowed == sorted(CorrectionConfig.model_fields)


def test_unknown_key_in_pg_section():
    with pytest.raises(ValueError, match=r"loss_fn\.ratio_clip is not a known field"):
        validate_section(PGLossConfig, {"ratio_clip": 0.2}, PG_PATH)


def test_several_problems_one_line_each():
    with pytest.raises(ValueError) as info:
        validate_section(CorrectionConfig, {"weight_cap": 0.5, "ema": 2.0, "bogus": 1}, AIS_PATH)
    lines = str(info.value).splitlines()
    assert len(lines) == 3, lines
    assert any(line.startswith("loss_fn.ais.weight_cap=0.5 is invalid") for line in lines)
    assert any(line.startswith("loss_fn.ais.ema=2.0 is invalid") for line in lines)
    assert any(line.startswith("loss_fn.ais.bogus is not a known field") for line in lines)


def test_style_guide_example_message():
    # The example quoted in style.md / config.py: path, value, allowed range, hint.
    with pytest.raises(ValueError) as info:
        validate_section(CorrectionConfig, {"weight_cap": 0.8}, AIS_PATH)
    assert re.fullmatch(
        r"loss_fn\.ais\.weight_cap=0\.8 is invalid: expected greater than 1 \(C: .*\)", str(info.value)
    ), str(info.value)


# ---- validate_section plumbing -------------------------------------------------------------


def test_non_mapping_is_a_type_error_naming_the_path():
    with pytest.raises(TypeError, match=r"loss_fn\.ais: expected a mapping of fields, got list"):
        validate_section(CorrectionConfig, [("mode", "tis")], AIS_PATH)
    with pytest.raises(TypeError, match=r"loss_fn: expected a mapping of fields, got str"):
        validate_section(PGLossConfig, "ratio_clip_min=0.2", PG_PATH)


def test_none_gives_defaults_and_instance_passes_through():
    cfg = validate_section(CorrectionConfig, None, AIS_PATH)
    assert cfg == CorrectionConfig()
    same = validate_section(CorrectionConfig, cfg, AIS_PATH)
    assert same is cfg
    pg = PGLossConfig(ratio_clip_c=3.0)
    assert validate_section(PGLossConfig, pg, PG_PATH) is pg


def test_defaults_match_method_doc():
    # Defaults stated in ais_method.md ([reconstruction] constants) and NeMo-RL's loss.
    cfg = CorrectionConfig()
    assert cfg.mode == "ais"
    assert cfg.weight_cap == 2.0
    assert cfg.tis.floor is None
    assert (cfg.icepop.min, cfg.icepop.max) == (0.5, 5.0)
    assert (cfg.seq_mask_geo.min, cfg.seq_mask_geo.max) == (0.999, 1.002)
    assert cfg.seq_weight == "geometric"
    assert cfg.log_ratio_clamp == 20.0
    assert cfg.severity_scale == 0.02
    assert cfg.reliability_floor == 0.5
    assert cfg.variance_tolerance == 1.0
    assert cfg.mixer == "product"
    assert cfg.use_severity_gate and cfg.use_reliability_gate and cfg.use_variance_gate
    assert cfg.ema == 0.0
    assert (cfg.alpha_min, cfg.alpha_max) == (0.0, 1.0)
    pg = PGLossConfig()
    assert (pg.ratio_clip_min, pg.ratio_clip_max, pg.ratio_clip_c) == (0.2, 0.2, None)
    assert pg.reference_policy_kl_type == "k3"
    assert pg.token_level_loss is True and pg.disable_ppo_ratio is False


@pytest.mark.parametrize(
    "data",
    [{"mode": m} for m in ("none", "tis", "icepop", "seq_mask_geo", "ais")]
    + [
        {"weight_cap": 1.0001},
        {"tis": {"floor": 0.0}},
        {"tis": {"floor": 0.999}},
        {"log_ratio_clamp": 80.0},
        {"reliability_floor": 0.0},
        {"ema": 0.0},
        {"ema": 0.999},
        {"constant_alpha": 0.0, "mixer": "constant"},
        {"seq_weight": "product"},
        {"alpha_min": 1.0, "alpha_max": 1.0},
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_boundary_values_accepted(data):
    cfg = validate_section(CorrectionConfig, data, AIS_PATH)
    for key, value in data.items():
        got = getattr(cfg, key)
        assert (got.model_dump() if isinstance(value, dict) else got) == value


def test_pg_boundary_values_accepted():
    pg = validate_section(
        PGLossConfig,
        {
            "ratio_clip_min": 0.0,
            "ratio_clip_max": 0.0,
            "ratio_clip_c": 1.0001,
            "kl_input_clamp_value": None,
            "kl_output_clamp_value": None,
        },
        PG_PATH,
    )
    assert pg.ratio_clip_c == 1.0001 and pg.kl_input_clamp_value is None


@pytest.mark.parametrize("model", [CorrectionConfig, PGLossConfig])
def test_models_are_frozen(model):
    cfg = model()
    field = next(iter(model.model_fields))
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        setattr(cfg, field, getattr(cfg, field))


# ---- the flat keys of a mode's knobs moved into its sub-section (issue 24) ------------------

MOVED = {
    "weight_floor": "tis.floor",
    "icepop_min": "icepop.min",
    "icepop_max": "icepop.max",
    "seq_mask_min": "seq_mask_geo.min",
    "seq_mask_max": "seq_mask_geo.max",
    "seq_mis_min": "seq_mis.min",
    "seq_mis_max": "seq_mis.max",
    "rs_estimator": "kl_rs.estimator",
    "rs_aggregation": "kl_rs.aggregation",
    "rs_threshold": "kl_rs.threshold",
    "rs_veto_min_ratio": "kl_rs.veto_min_ratio",
    "m2po_tau": "m2po.tau",
    "tbpo_clip_low": "tbpo.clip_low",
    "tbpo_clip_high": "tbpo.clip_high",
    "tbpo_neg_clip_low": "tbpo.neg_clip_low",
    "tbpo_neg_clip_high": "tbpo.neg_clip_high",
}


def test_every_moved_key_is_listed():
    assert dict(CorrectionConfig.moved_keys) == MOVED


@pytest.mark.parametrize(("old", "new"), MOVED.items())
def test_a_moved_key_is_refused_naming_the_new_one(old, new):
    with pytest.raises(ValueError) as info:
        validate_section(CorrectionConfig, {"mode": "tis", old: 0.5}, AIS_PATH)
    assert str(info.value) == f"{AIS_PATH}.{old} moved: use {AIS_PATH}.{new}"
    with pytest.raises(pydantic.ValidationError, match=f"{old} moved: use {new}"):
        CorrectionConfig(**{old: 0.5})


def test_the_new_key_takes_the_old_value():
    # icepop_min: 0.6 -> icepop: {min: 0.6}; the other side keeps its default
    cfg = validate_section(CorrectionConfig, {"icepop": {"min": 0.6}}, AIS_PATH)
    assert (cfg.icepop.min, cfg.icepop.max) == (0.6, 5.0)


def test_nested_sections_validate_from_omegaconf():
    # NeMo-RL hands the loss_fn section over as an OmegaConf DictConfig (nested ones too)
    omegaconf = pytest.importorskip("omegaconf")
    data = omegaconf.OmegaConf.create({"mode": "kl_rs", "kl_rs": {"threshold": 0.02, "veto_min_ratio": 0.5}})
    cfg = validate_section(CorrectionConfig, data, AIS_PATH)
    assert (cfg.kl_rs.threshold, cfg.kl_rs.veto_min_ratio) == (0.02, 0.5)


def test_unknown_key_in_a_sub_section_names_its_fields():
    with pytest.raises(ValueError) as info:
        validate_section(CorrectionConfig, {"icepop": {"low": 0.5}}, AIS_PATH)
    assert str(info.value) == "loss_fn.ais.icepop.low is not a known field (allowed: max, min)"
