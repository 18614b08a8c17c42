"""Validation of incoming updates and joins, and of federation.toml."""

from __future__ import annotations

import pytest
import torch

from neurofed.broker.config import ConfigError, config_from_dict, load_config
from neurofed.broker.protocol import JoinMsg, UpdateMsg, new_id, pack
from neurofed.broker.rounds import SeenIds
from neurofed.broker.validation import (
    Rejected,
    UpdateRules,
    check_envelope,
    check_join,
    check_update,
    tensor_specs,
    update_norm,
)
from neurofed.trainer.models import build_model


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model = build_model("eegnet", 21, 2, 320, 80.0, "batch_specific")
    g = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rules = UpdateRules(round=2, task_id=new_id(), base_sha256="b" * 64, selected=frozenset({"S001", "S002"}),
                        state_specs=tensor_specs(g), extra_specs={}, global_state=g, n_trials={"S001": 45})
    return g, rules


def _msg(rules, **kw):
    d = {"federation": "f", "sender": "S001", "round": rules.round, "task_id": rules.task_id, "n_samples": 45,
         "base_sha256": rules.base_sha256}
    d.update(kw)
    return UpdateMsg(**d)


def _state(g, delta=0.01):
    return {k: v + delta for k, v in g.items()}


def test_valid_update_is_accepted(setup):
    g, rules = setup
    upd = check_update(_msg(rules), pack({"state": _state(g)}), rules, set(), SeenIds())
    assert upd.n_samples == 45 and upd.state.keys() == g.keys()


@pytest.mark.parametrize("case,code", [
    ("round", "late"), ("future", "future_round"), ("task", "wrong_task"), ("sender", "not_selected"),
    ("dup", "duplicate"), ("base", "wrong_base"), ("count", "bad_count"), ("shape", "bad_tensors"),
    ("dtype", "bad_tensors"), ("missing", "bad_tensors"), ("extra", "bad_tensors"), ("nan", "non_finite"),
    ("inf", "non_finite"), ("replay", "replay"),
])
def test_bad_updates_are_rejected_with_a_reason(setup, case, code):
    g, rules = setup
    st, kw, accepted, seen = _state(g), {}, set(), SeenIds()
    k0 = next(iter(g))
    if case == "round":
        kw["round"] = 1
    elif case == "future":
        kw["round"] = 3
    elif case == "task":
        kw["task_id"] = new_id()
    elif case == "sender":
        kw["sender"] = "S009"
    elif case == "dup":
        accepted = {"S001"}
    elif case == "base":
        kw["base_sha256"] = "c" * 64
    elif case == "count":
        kw["n_samples"] = 46
    elif case == "shape":
        st[k0] = torch.zeros(3)
    elif case == "dtype":
        st[k0] = st[k0].double()
    elif case == "missing":
        st.pop(k0)
    elif case == "extra":
        st["evil"] = torch.zeros(1)
    elif case == "nan":
        st[k0] = st[k0].clone().fill_(float("nan"))
    elif case == "inf":
        st[k0] = st[k0].clone().fill_(float("inf"))
    msg = _msg(rules, **kw)
    if case == "replay":
        seen.add(msg.msg_id)
    with pytest.raises(Rejected) as ei:
        check_update(msg, pack({"state": st}), rules, accepted, seen)
    assert ei.value.code == code


def test_norm_bound_clips_or_rejects(setup):
    g, rules = setup
    big = _state(g, 1.0)
    rules.norm_bound = 0.5
    clipped = check_update(_msg(rules), pack({"state": big}), rules, set(), SeenIds()).state
    assert abs(update_norm(clipped, g) - 0.5) < 1e-4
    rules.norm_action = "reject"
    with pytest.raises(Rejected, match="norm_bound"):
        check_update(_msg(rules), pack({"state": big}), rules, set(), SeenIds())


def test_envelope_identity_and_join_compatibility():
    j = JoinMsg(federation="f", sender="S001", n_trials=45, n_channels=21, n_times=320, sfreq=80.0,
                classes=["left_fist", "right_fist"])
    check_envelope("join", None, j, "f")
    with pytest.raises(Rejected, match="spoofed"):
        check_envelope("status", "S002", j.model_copy(update={"kind": "status"}), "f")
    with pytest.raises(Rejected, match="wrong_federation"):
        check_envelope("join", None, j, "g")
    spec = config_from_dict({}).model_spec()
    check_join(j, spec)
    with pytest.raises(Rejected, match="incompatible"):
        check_join(j.model_copy(update={"n_channels": 64}), spec)


def test_config_rejects_unknown_keys_and_bad_values(tmp_path):
    assert load_config(None).model_spec().n_times == 320
    for bad in ({"federation": {"rounds": 3, "typo": 1}}, {"federation": {"fraction": 1.5}},
                {"federation": {"strategy": "nope"}}, {"local": {"lr": 0.1, "lrr": 1}}, {"preprocess": {"fmin": 50}},
                {"surprise": {}}):
        with pytest.raises(ConfigError):
            config_from_dict(bad)
    p = tmp_path / "f.toml"
    p.write_text("[federation\n")
    with pytest.raises(ConfigError, match="cannot read TOML"):
        load_config(p)
    with pytest.raises(ConfigError, match="no such"):
        load_config(tmp_path / "missing.toml")
