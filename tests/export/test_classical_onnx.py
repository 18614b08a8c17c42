"""The federated classical pipelines in ONNX: plain and standalone graphs equal the Python decoder on a real
held-out recording's windows (onnxruntime and edge-client infer's engine); the eigendecomposition-free matrix
logarithm equals pyriemann's on real windows."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from neurofed.edge.infer import InferenceEngine, StandaloneStep
from neurofed.export.decoder import StandaloneModel
from neurofed.export.onnx_export import export_checkpoint
from neurofed.export.runtime import OnnxModel
from neurofed.export.standalone import eegmmidb_session_windows, export_standalone, logm_iss
from neurofed.trainer.checkpoint import ModelMeta, save_checkpoint
from neurofed.trainer.data import PreprocessConfig, load_subjects
from neurofed.trainer.experiments.runner import global_state_of, run_federated
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import get_strategy

TRAIN, HELD_OUT = (1, 2), 3
ALGOS = {"fed-csp-lda": "csp_lda", "fed-tangent": "tangent_lda"}


@pytest.fixture(scope="module", params=list(ALGOS))
def exported(request, data_dir, tmp_path_factory, cache_env):
    algo = request.param
    pre = PreprocessConfig.from_preset("sensorimotor21", resample=80.0, ea=True)
    subs = load_subjects(list(TRAIN), pre, str(data_dir))
    model, _ = run_federated({sd.subject: sd for sd in subs}, ALGOS[algo], get_strategy(algo), LocalConfig(), 2,
                             1.0, 0)
    ref = subs[0]
    meta = ModelMeta(ALGOS[algo], ref.X.shape[1], len(ref.classes), ref.X.shape[2], ref.sfreq, "standard",
                     list(ref.ch_names), list(ref.classes), pre.to_dict(), algo, 8,
                     {k: v for sd in subs for k, v in sd.file_hashes.items()}, {"seed": 0, "rounds": 2})
    d = tmp_path_factory.mktemp(algo)
    ckpt = save_checkpoint(d / "m.safetensors", global_state_of(model), meta)
    _, report = export_checkpoint(ckpt, d / "m.onnx", data_dir)
    export_standalone(ckpt, d / "sa.onnx", rate=160.0)
    return algo, d / "m.onnx", d / "sa.onnx", report


def test_standalone_graph_decodes_a_real_recording_like_the_python_pipeline(exported, data_dir):
    """Held-out S003's three imagery sessions, window by window from raw microvolts: the standalone graph in
    onnxruntime, and edge-client infer's engine running it, equal the Python decoder (preprocessing + online EA in
    numpy + the plain graph) within 1e-4 in probabilities, same classes."""
    algo, plain, sa, report = exported
    assert max(report.max_abs_diff.values()) <= 1e-4  # plain graph == torch on real held-out trials (export's own check)
    ops = {n.op_type for n in onnx.load(str(sa)).graph.node}
    assert not ops & {"If", "Loop", "Scan", "BatchNormalization"}
    sm, om = StandaloneModel(sa), OnnxModel(plain)
    sessions = eegmmidb_session_windows(HELD_OUT, list(om.meta.ch_names), list(om.meta.classes), 0.0, 4.0, data_dir)
    eng = InferenceEngine(om, om.meta.ch_names, 160.0)
    want = np.array([eng.process(w, 0.0).probabilities for _, ws, _, _ in sessions for w in ws])
    state, got = sm.initial_state(), []
    for _, ws, _, _ in sessions:
        for w in ws:
            p, state = sm.run(w.astype(np.float32), state)
            got.append(p)
    got = np.array(got)
    assert len(got) == 45 and np.isfinite(got).all()
    assert np.abs(got - want).max() <= 1e-4 and (got.argmax(1) == want.argmax(1)).all()
    edge = InferenceEngine(sm, sm.meta.ch_names, 160.0, decoder=StandaloneStep(sm, 160.0))
    via_edge = np.array([edge.process(w, 0.0).probabilities for _, ws, _, _ in sessions for w in ws])
    np.testing.assert_allclose(via_edge, want, atol=1e-4)


def test_logm_without_eigendecomposition_equals_pyriemann_on_real_windows(data_dir, cache_env):
    """Whitened OAS covariances of 360 real EA'd trials (S001-S008, eigenvalues 0.16-31) and 90 unaligned ones
    (1.3-6700): max abs error vs pyriemann's logm measured 7e-13; 1e-10 allowed."""
    from pyriemann.estimation import Covariances
    from pyriemann.geometry.base import invsqrtm, logm
    from pyriemann.geometry.mean import mean_logeuclid

    for ea, subjects in ((True, list(range(1, 9))), (False, [1, 2])):
        pre = PreprocessConfig.from_preset("sensorimotor21", resample=80.0, ea=ea)
        covs = np.concatenate([Covariances("oas").fit_transform(sd.X.astype(np.float64))
                               for sd in load_subjects(subjects, pre, str(data_dir))])
        r = invsqrtm(mean_logeuclid(covs)) if ea else np.eye(covs.shape[1])
        w = r @ covs @ r
        assert np.abs(logm_iss(torch.from_numpy(w)).numpy() - logm(w)).max() <= 1e-10
