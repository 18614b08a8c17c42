"""fleeg_proj_eegnet (issue 19): a per-device channel map onto the common montage, then the whole EEGNet
shared; the map is aggregated per device profile by the hierarchical strategy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neurofed.trainer.data.config import SENSORIMOTOR_21
from neurofed.trainer.data.profiles import get_profile, interpolation_matrix
from neurofed.trainer.fl.api import group_key
from neurofed.trainer.fl.client import ClientUpdate
from neurofed.trainer.fl.init import init_group_models, init_server_state
from neurofed.trainer.fl.local import LocalConfig, train_local
from neurofed.trainer.fl.server import ServerState, downlink, server_update
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import EEGNet, FleegProjEEGNet, build_model, count_parameters

U8 = get_profile("unicorn8").channels
LAB = get_profile("lab64").channels


def _model(chans, seed: int = 0, bn: str = "standard") -> FleegProjEEGNet:
    torch.manual_seed(seed)
    return build_model("fleeg_proj_eegnet", len(chans), 2, 320, 80.0, bn, ch_names=chans)


def test_shapes_keys_and_init():
    m = _model(U8)
    assert isinstance(m, FleegProjEEGNet) and m.n_channels == 8
    assert m(torch.randn(4, 8, 320)).shape == (4, 2)
    local = [k for k in m.state_dict() if k.startswith("local.")]
    assert local == ["local.weight"] and m.state_dict()["local.weight"].shape == (21, 8)
    assert m.local.weight.requires_grad
    assert np.allclose(m.local.weight.detach().numpy(), interpolation_matrix(U8, SENSORIMOTOR_21), atol=1e-7)
    # the shared part has exactly EEGNet's keys and shapes over the 21 common channels
    ref = EEGNet(21, 2, 320, 80.0, "standard").state_dict()
    shared = {k: v for k, v in m.state_dict().items() if not k.startswith("local.")}
    assert {k: v.shape for k, v in shared.items()} == {k: v.shape for k, v in ref.items()}
    # other devices: same shared shapes, their own map
    assert {k: v.shape for k, v in _model(LAB).state_dict().items() if k != "local.weight"} == \
        {k: v.shape for k, v in shared.items()}


def test_build_needs_channel_names_and_checks_their_count():
    with pytest.raises(ValueError, match="needs the input's channel names"):
        build_model("fleeg_proj_eegnet", 8, 2, 320, 80.0)
    with pytest.raises(ValueError, match="7 channel names for 8 input channels"):
        build_model("fleeg_proj_eegnet", 8, 2, 320, 80.0, ch_names=U8[:7])
    assert isinstance(build_model("eegnet", 8, 2, 320, 80.0, ch_names=U8), EEGNet)  # ignored by other models


@pytest.mark.parametrize("bn", ["standard", "batch_specific"])
def test_device_with_all_common_channels_equals_eegnet_on_them(bn):
    """lab64 records all 21 common channels: the map is a channel selection and, with the same seed
    (the map draws no random numbers), the model IS EEGNet on those channels."""
    torch.manual_seed(5)
    ref = EEGNet(21, 2, 320, 80.0, bn)
    m = _model(LAB, seed=5, bn=bn)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in ref.state_dict().items())
    x = torch.randn(6, 64, 320)
    sel = [LAB.index(c) for c in SENSORIMOTOR_21]
    ref.eval(), m.eval()
    assert torch.equal(m(x), ref(x[:, sel]))


def _const_state(model, value: float) -> dict:
    return {k: (torch.full_like(v, value) if torch.is_floating_point(v) else v.clone())
            for k, v in model.state_dict().items()}


def test_hierarchical_aggregation_keeps_the_map_per_profile():
    st = get_strategy("fleeg", clip_mult=0)  # the aggregation rule alone
    models = {"u8": _model(U8), "lab64": _model(LAB)}
    server = ServerState(init_server_state(models, st.group_prefixes))
    k = "local.weight"
    assert server.global_state[group_key("u8", k)].shape == (21, 8)
    assert server.global_state[group_key("lab64", k)].shape == (21, 64)
    assert k not in server.global_state
    ups = [("a", ClientUpdate(_const_state(models["u8"], 1.0), 10, group="u8")),
           ("b", ClientUpdate(_const_state(models["u8"], 4.0), 30, group="u8")),
           ("c", ClientUpdate(_const_state(models["lab64"], 10.0), 20, group="lab64"))]
    new = server_update(server, ups, st, 3).global_state
    assert torch.allclose(new[group_key("u8", k)], torch.tensor(3.25))      # (10*1 + 30*4) / 40: u8 only
    assert torch.allclose(new[group_key("lab64", k)], torch.tensor(10.0))   # lab64's own client only
    assert torch.allclose(new["conv_spatial.weight"], torch.tensor((10 + 120 + 200) / 60))  # the spatial conv: all
    assert torch.allclose(new["temporal.1.weight"], torch.tensor((10 + 120 + 200) / 60))
    for g, model in models.items():  # each profile's clients receive their own map and the shared EEGNet
        down = downlink(new, get_strategy("fleeg"), model, g)
        assert torch.equal(down[k], new[group_key(g, k)])


def test_group_models_get_their_devices_channel_names():
    from neurofed.trainer.data.dataset import SubjectData

    def sd(name, chans):
        return SubjectData(name, np.zeros((2, len(chans), 320), np.float32), np.array([0, 1]), ("l", "r"), 80.0,
                           list(chans))

    clients = {"S001": sd("S001", U8), "S002": sd("S002", LAB), "S003": sd("S003", U8)}
    groups = {"S001": "unicorn8", "S002": "lab64", "S003": "unicorn8"}
    models = init_group_models(clients, groups, "fleeg_proj_eegnet", "standard", 0)
    assert models["unicorn8"].ch_names == U8 and models["lab64"].ch_names == LAB
    shared = [k for k in models["lab64"].state_dict() if not k.startswith("local.")]
    assert all(torch.equal(models["lab64"].state_dict()[k], models["unicorn8"].state_dict()[k]) for k in shared)


def test_checkpoint_round_trip_rebuilds_the_map(tmp_path):
    from neurofed.trainer.checkpoint import ModelMeta, load_checkpoint, save_checkpoint
    from neurofed.trainer.experiments.runner import global_state_of

    m = _model(U8)
    with torch.no_grad():
        m.local.weight.add_(0.1)  # trained away from the interpolation init
    meta = ModelMeta("fleeg_proj_eegnet", 8, 2, 320, 80.0, "standard", list(U8), ["left", "right"])
    save_checkpoint(tmp_path / "m.safetensors", global_state_of(m), meta)
    back, _ = load_checkpoint(tmp_path / "m.safetensors")
    assert torch.equal(back.local.weight, m.local.weight)
    x = torch.randn(3, 8, 320)
    m.eval(), back.eval()
    assert torch.equal(back(x), m(x))


def test_profile_channels_interpolate_maps_every_device_onto_the_common_montage():
    """--profile-channels interpolate (row c2): the FIXED matrix applied to the preprocessed trials."""
    from neurofed.trainer.data.dataset import SubjectData
    from neurofed.trainer.experiments.simulate import interpolate_subject

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8, 320)).astype(np.float32)
    sd = SubjectData("S001", x, np.array([0, 1, 0]), ("l", "r"), 80.0, list(U8))
    out = interpolate_subject(sd)
    assert out.X.shape == (3, 21, 320) and out.X.dtype == np.float32 and out.ch_names == list(SENSORIMOTOR_21)
    w = interpolation_matrix(U8, SENSORIMOTOR_21)
    assert np.allclose(out.X, np.einsum("kc,nct->nkt", w, x), atol=1e-5)
    assert np.array_equal(out.X[:, SENSORIMOTOR_21.index("C3")], x[:, U8.index("C3")])  # present: copied exactly
    lab = SubjectData("S002", rng.standard_normal((2, 64, 320)).astype(np.float32), np.array([0, 1]), ("l", "r"),
                      80.0, list(LAB))
    assert np.array_equal(interpolate_subject(lab).X, lab.X[:, [LAB.index(c) for c in SENSORIMOTOR_21]])


def test_fixed_map_model_is_the_proj_model_with_a_frozen_map():
    torch.manual_seed(3)
    fixed = build_model("fleeg_fixmap_eegnet", 8, 2, 320, 80.0, "standard", ch_names=U8)
    proj = _model(U8, seed=3)
    assert isinstance(fixed, FleegProjEEGNet) and not fixed.local.weight.requires_grad
    assert all(torch.equal(v, proj.state_dict()[k]) for k, v in fixed.state_dict().items())
    assert count_parameters(proj) - count_parameters(fixed) == 21 * 8


@pytest.mark.parametrize("algorithm", ["fedbs", "safe", "fedprox"])
def test_fixed_map_never_moves_in_local_training(algorithm):
    """SGD, SAM, FGSM/AWP and FedProx's proximal term leave the frozen map bit-identical (the rest trains)."""
    torch.manual_seed(0)
    m = build_model("fleeg_fixmap_eegnet", 8, 2, 320, 80.0, "batch_specific", ch_names=U8)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((16, 8, 320)).astype(np.float32), np.tile([0, 1], 8)
    train_local(m, X, y, get_strategy(algorithm), LocalConfig(lr=0.05, batch_size=8, local_epochs=1), seed=0)
    after = m.state_dict()
    assert torch.equal(after["local.weight"], before["local.weight"])
    assert not torch.equal(after["conv_spatial.weight"], before["conv_spatial.weight"])


def test_fixed_map_model_trains_like_eegnet_on_interpolated_trials():
    """The deployable fixed-map model on a device's own channels and row c2's plain EEGNet on the trials mapped
    by the same matrix (--profile-channels interpolate) start identical and train alike (float rounding of the
    map's product apart)."""
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((16, 8, 320)).astype(np.float32), np.tile([0, 1], 8)
    w = interpolation_matrix(U8, SENSORIMOTOR_21).astype(np.float32)
    Xi = np.einsum("kc,nct->nkt", w, X).astype(np.float32)  # what interpolate_subject does
    torch.manual_seed(7)
    fixed = build_model("fleeg_fixmap_eegnet", 8, 2, 320, 80.0, "standard", ch_names=U8)
    torch.manual_seed(7)
    plain = EEGNet(21, 2, 320, 80.0, "standard")
    assert all(torch.equal(v, fixed.state_dict()[k]) for k, v in plain.state_dict().items())
    cfg = LocalConfig(lr=0.05, batch_size=8, local_epochs=2)
    train_local(fixed, X, y, get_strategy("fedavg"), cfg, seed=4)
    train_local(plain, Xi, y, get_strategy("fedavg"), cfg, seed=4)
    for k, v in plain.state_dict().items():
        assert torch.allclose(fixed.state_dict()[k].double(), v.double(), atol=1e-5), k
    fixed.eval(), plain.eval()
    x = rng.standard_normal((4, 8, 320)).astype(np.float32)
    xi = torch.from_numpy(np.einsum("kc,nct->nkt", w, x).astype(np.float32))
    assert torch.allclose(fixed(torch.from_numpy(x)), plain(xi), atol=1e-5)
