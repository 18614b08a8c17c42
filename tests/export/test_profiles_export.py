"""Issue 19, item 4: a hierarchical (fleeg) checkpoint exports to one ONNX model per device profile (the shared
module + that profile's own, its profile in the metadata), each equal to torch on real trials recorded through
its device; `edge-client infer` picks the model whose profile matches the stream, or refuses in one line."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from neurofed.edge.infer import pick_model
from neurofed.export.metadata import read_onnx_meta
from neurofed.export.onnx_export import ATOL, compare
from neurofed.trainer.checkpoint import ModelMeta, load_profile_models, save_checkpoint
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.profiles import get_profile, load_profile_subject
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import get_strategy

torch.set_num_threads(1)
PROFILES = {1: "unicorn8", 2: "cyton_daisy16"}
PRE = PreprocessConfig(resample=80.0)


@pytest.fixture(scope="module")
def fleeg_ckpt(tmp_path_factory, data_dir):
    """A fleeg federation's server state after one real round (S001 on unicorn8, S002 on cyton_daisy16), saved as
    the coordinator saves it: the shared module, `@<profile>/` modules and the profiles' definitions."""
    os.environ.setdefault("NEUROFED_CACHE", str(tmp_path_factory.mktemp("cache")))
    clients = {f"S{s:03d}": load_profile_subject(s, p, PRE, data_dir, 0) for s, p in PROFILES.items()}
    groups = {f"S{s:03d}": p for s, p in PROFILES.items()}
    _, info = run_federated(clients, "fleeg_eegnet", get_strategy("fleeg"), LocalConfig(batch_size=16, local_epochs=1),
                            1, 1.0, 0, groups=groups)
    sd = clients["S001"]
    meta = ModelMeta("fleeg_eegnet", 0, 2, sd.X.shape[2], sd.sfreq, "standard", [], list(sd.classes), PRE.to_dict(),
                     "fleeg", 8, {k: v for c in clients.values() for k, v in c.file_hashes.items()},
                     {"device_profiles": [get_profile(p).to_dict() for p in sorted(PROFILES.values())]})
    path = save_checkpoint(tmp_path_factory.mktemp("fleeg") / "global_model.safetensors",
                           info["server"].global_state, meta)
    return path, info["models"]


def test_one_verified_onnx_model_per_profile(fleeg_ckpt, data_dir, tmp_path):
    from neurofed.cli import app

    ckpt, models = fleeg_ckpt
    split = load_profile_models(ckpt)  # the checkpoint splits into exactly the simulation's per-profile models
    assert sorted(split) == sorted(PROFILES.values())
    for p, (m, meta) in split.items():
        assert meta.ch_names == list(get_profile(p).channels) and meta.extra["device"]["name"] == p
        assert all(torch.equal(v, models[p].state_dict()[k]) for k, v in m.state_dict().items())

    r = CliRunner().invoke(app, ["export", str(ckpt), "-o", str(tmp_path / "model.onnx"), "--data-dir",
                                 str(data_dir), "--json", str(tmp_path / "rep.json")])
    assert r.exit_code == 0, r.output + repr(r.exception)
    rep = json.loads((tmp_path / "rep.json").read_text())["profiles"]
    assert sorted(rep) == sorted(PROFILES.values())
    assert not (tmp_path / "model.onnx").exists()
    for p in PROFILES.values():
        path = tmp_path / f"model.{p}.onnx"
        meta = read_onnx_meta(path)
        prof = get_profile(p)
        assert meta.profile["name"] == p and meta.profile["channels"] == list(prof.channels)
        assert meta.profile["sfreq"] == prof.sfreq and meta.n_channels == prof.n_channels
        assert rep[p]["subjects"] == ["S003"] and rep[p]["held_out"]  # verified on a subject it never saw
        # parity, measured here too: onnxruntime vs the simulation's torch model of that profile, on real trials
        # of a held-out subject recorded through the profile's device
        X = load_profile_subject(3, p, PRE, data_dir, 0).X
        diffs, mism = compare(models[p], path.read_bytes(), X)
        print(f"{p}: ONNX vs torch on {len(X)} trials of S003, max |dlogit| per batch size {diffs}")  # pytest -rP
        assert max(diffs.values()) <= ATOL and not any(mism.values()), (p, diffs, mism)
    # the two models share the global module and differ in their local one
    h = {p: read_onnx_meta(tmp_path / f"model.{p}.onnx").model_hash for p in PROFILES.values()}
    assert len(set(h.values())) == 2


def test_int8_export_gives_one_quantised_model_per_profile(fleeg_ckpt, data_dir, tmp_path):
    """`neurofed export CKPT --int8` of a hierarchical checkpoint: besides each profile's verified float model, its
    dynamically int8-quantised copy (`model.<profile>.int8.onnx`, same profile and model hash in the metadata),
    scored against the float model on the held-out trials recorded through that profile's device (the bounds of the
    single-model int8 test, tests/export/test_quantize.py), and picked by `edge-client infer` for its stream."""
    import onnx

    from neurofed.cli import app
    from neurofed.export.runtime import OnnxModel

    ckpt, _ = fleeg_ckpt
    r = CliRunner().invoke(app, ["export", str(ckpt), "-o", str(tmp_path / "model.onnx"), "--int8", "--data-dir",
                                 str(data_dir), "--json", str(tmp_path / "rep.json")])
    assert r.exit_code == 0, r.output + repr(r.exception)
    rep = json.loads((tmp_path / "rep.json").read_text())["profiles"]
    assert sorted(rep) == sorted(PROFILES.values())
    for p in PROFILES.values():
        fp32, q = tmp_path / f"model.{p}.onnx", tmp_path / f"model.{p}.int8.onnx"
        d = rep[p]["int8"]
        assert d["path"] == str(q) and d["ops"] == "all" and q.is_file()
        meta, qmeta = read_onnx_meta(fp32), read_onnx_meta(q)
        assert qmeta.quantized == "dynamic int8 (all)" and qmeta.profile == meta.profile
        assert qmeta.model_hash == meta.model_hash and meta.quantized is None
        types = {n.op_type for n in onnx.load(str(q)).graph.node}
        assert {"ConvInteger", "MatMulInteger"} <= types and not {"Conv", "Gemm"} & types  # ops="all"
        # scored on the float model's verification trials: a held-out subject recorded through the profile
        X = load_profile_subject(3, p, PRE, data_dir, 0).X
        assert rep[p]["subjects"] == ["S003"] and d["n_trials"] == len(X)
        assert abs(d["bca_delta"] - (d["bca_int8"] - d["bca_fp32"])) < 1e-12
        assert d["size_int8_bytes"] < d["size_fp32_bytes"]
        lf, lq = OnnxModel(fp32).logits(X), OnnxModel(q).logits(X)
        assert abs(float(abs(lf - lq).max()) - d["max_abs_logit_diff"]) < 1e-6
        print(f"{p}: int8 vs fp32 on {len(X)} trials of S003: agreement {d['agreement']:.3f}, max |dlogit| "
              f"{d['max_abs_logit_diff']:.3g}, {d['size_fp32_bytes']} -> {d['size_int8_bytes']} bytes")  # pytest -rP
        assert d["agreement"] >= 0.8 and d["max_abs_logit_diff"] < 0.5
        prof = get_profile(p)
        assert pick_model([q for q in tmp_path.glob("*.int8.onnx")], list(prof.channels), prof.sfreq) == q
    r = CliRunner().invoke(app, ["export", str(ckpt), "-o", str(tmp_path / "x.onnx"), "--int8", "--int8-ops", "some",
                                 "--no-verify"])
    assert isinstance(r.exception, NeuroFedError) and "choose from ['all', 'linear']" in str(r.exception)
    assert not list(tmp_path.glob("x*.onnx"))  # refused before exporting anything


def test_infer_picks_the_model_of_the_streams_profile(fleeg_ckpt, data_dir, tmp_path):
    from neurofed.export.onnx_export import export_profiles

    ckpt, _ = fleeg_ckpt
    done = export_profiles(ckpt, tmp_path / "m" / "model.onnx", verify=False)
    folder = tmp_path / "m"
    for p in PROFILES.values():
        prof = get_profile(p)
        assert pick_model([folder], list(prof.channels), prof.sfreq) == done[p][0]
        assert pick_model([done[q][0] for q in PROFILES.values()], [c.lower() for c in prof.channels],
                          prof.sfreq) == done[p][0]
    cyton8 = get_profile("cyton8")
    with pytest.raises(NeuroFedError) as exc:
        pick_model([folder], list(cyton8.channels), cyton8.sfreq)
    msg = str(exc.value)
    assert "stream with 8 channels at 250 Hz" in msg and "matches no device profile (cyton_daisy16, unicorn8)" in msg
    assert "\n" not in msg
    uni = get_profile("unicorn8")
    with pytest.raises(NeuroFedError, match="matches no device profile"):  # right channels, wrong rate
        pick_model([folder], list(uni.channels), 500.0)
    with pytest.raises(NeuroFedError, match="matches no device profile"):  # one profile model, another device
        pick_model([done["unicorn8"][0]], list(cyton8.channels), cyton8.sfreq)
    twin = tmp_path / "unicorn8_copy.onnx"
    twin.write_bytes(done["unicorn8"][0].read_bytes())
    with pytest.raises(NeuroFedError, match="several models are for"):
        pick_model([folder, twin], list(uni.channels), uni.sfreq)


@pytest.mark.integration
@pytest.mark.slow
def test_infer_cli_decodes_a_profile_stream_and_refuses_a_stranger(fleeg_ckpt, data_dir, tmp_path):
    """Over real LSL: a headset streaming a real recording through unicorn8 is decoded with unicorn8's model (chosen
    from a folder of both); a cyton8 headset is refused with one line."""
    from neurofed.edge.cli import app
    from neurofed.export.onnx_export import export_profiles
    from neurofed.firmware_sim.player import HeadsetPlayer, PlayerConfig
    from neurofed.firmware_sim.recording import load_recording, through_profile
    from neurofed.trainer.data.eegmmidb import RUN_EVENT_LABELS
    from tests.lsl_support import unique_name

    ckpt, _ = fleeg_ckpt
    export_profiles(ckpt, tmp_path / "m" / "model.onnx", verify=False)
    rec = load_recording(data_dir / "eegmmidb" / "S003" / "S003R04.edf", RUN_EVENT_LABELS[4])
    for p, ok in (("unicorn8", True), ("cyton8", False)):
        name = unique_name(f"fleeg-{p}")
        player = HeadsetPlayer(through_profile(rec, p, 0), PlayerConfig(name=name, speed=20.0, wait_consumers=5.0))
        player.start()
        try:
            r = CliRunner().invoke(app, ["infer", "--model", str(tmp_path / "m"), "--stream", name, "--timeout", "5",
                                         "--duration", "6", "--quiet", "--stats-out", str(tmp_path / f"{p}.json")])
        finally:
            player.stop()
            player.join(10)
        if ok:
            assert r.exit_code == 0, r.output + repr(r.exception)
            assert "fleeg_eegnet" in r.output
            assert json.loads((tmp_path / f"{p}.json").read_text())["predictions"] > 0
        else:
            assert isinstance(r.exception, NeuroFedError), r.output
            assert "matches no device profile (cyton_daisy16, unicorn8)" in str(r.exception)


def test_standalone_export_gives_one_graph_per_profile_at_its_rate_and_unit(fleeg_ckpt, data_dir, tmp_path):
    """`neurofed export CKPT --standalone` of a hierarchical checkpoint: one standalone graph per device profile, each
    taking its headset's rate and unit (cyton_daisy16: ADS1299 counts at 125 Hz), equal to the Python engine with that
    profile's plain model on every window of a held-out subject's sessions as the headset streams them (parity as
    `neurofed bench standalone` checks the single model: <= 1e-4, no class mismatch; onnxruntime and tract)."""
    from neurofed.bench_standalone import compare_subject, device_sessions
    from neurofed.cli import app
    from neurofed.edge.infer import InferenceEngine, StandaloneStep
    from neurofed.export.decoder import StandaloneModel
    from neurofed.export.onnx_export import export_profiles
    from neurofed.export.runtime import OnnxModel

    ckpt, _ = fleeg_ckpt
    r = CliRunner().invoke(app, ["export", str(ckpt), "--standalone", "-o", str(tmp_path / "sa.onnx")])
    assert r.exit_code == 0, r.output + repr(r.exception)
    plain = export_profiles(ckpt, tmp_path / "plain.onnx", verify=False)
    for p in PROFILES.values():
        prof = get_profile(p)
        sm = StandaloneModel(tmp_path / f"sa.{p}.onnx")
        assert (sm.info.rate, sm.info.unit) == (prof.sfreq, prof.unit) and sm.meta.profile["name"] == p
        assert sm.info.unit_to_uv == pytest.approx(1.0 / prof.scale)
        row = compare_subject(plain[p][0], tmp_path / f"sa.{p}.onnx", 3, data_dir, reference=False, profile=prof)
        print(f"{p}: standalone vs engine on {row['windows']} windows of S003: {row['runtimes']}")  # pytest -rP
        for rt in row["runtimes"].values():
            assert rt["max_abs_prob_diff"] <= 1e-4 and rt["class_mismatches"] == 0, (p, row)
        # edge-client's path: the engine reads the stream's unit, hands microvolts to the graph's step
        sessions, rate, units = device_sessions(3, sm.meta, data_dir, prof)
        eng = InferenceEngine(sm, sm.meta.ch_names, rate, stream_units=units, decoder=StandaloneStep(sm, rate))
        eng_plain = InferenceEngine(OnnxModel(plain[p][0]), sm.meta.ch_names, rate, stream_units=units)
        for w in sessions[0][1][:10]:
            a, b = eng.process(w, 0.0).probabilities, eng_plain.process(w, 0.0).probabilities
            assert max(abs(x - y) for x, y in zip(a, b)) <= 1e-4
    r = CliRunner().invoke(app, ["export", str(ckpt), "--standalone", "--rate", "250", "-o", str(tmp_path / "x.onnx")])
    assert r.exit_code != 0 and "each device profile's graph takes its profile's rate and unit" in str(r.exception)
