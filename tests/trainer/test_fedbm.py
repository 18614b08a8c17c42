"""FedBM: LKCC construction (hand-computed), the frozen classifier across rounds, CGDE's losses, bad input."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from neurofed.trainer.concepts import (
    RESOURCE,
    ConceptError,
    concept_stats,
    encoder_available,
    load_concepts,
    prompts_for,
)
from neurofed.trainer.fl.algorithms.fedbm import (
    ConceptHead,
    ConditionalGenerator,
    alignment_prior_loss,
    check_head,
    concept_extras,
    diversity_loss,
    generator_losses,
    install_head,
    surrogate_loss,
)
from neurofed.trainer.fl.client import client_update, init_client_state
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.server import ServerState, downlink, server_extras_for_clients, server_update
from neurofed.trainer.fl.strategies import get_strategy
from neurofed.trainer.models import build_model

N_CH, N_T, SF = 4, 64, 32.0


def _model(bn: str = "standard", n_classes: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("eegnet", N_CH, n_classes, N_T, SF, bn)


def _data(n: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, N_CH, N_T)).astype(np.float32), np.arange(n, dtype=np.int64) % 2


def test_concept_stats_hand_computed():
    # class 0: embeddings (1,0), (0,0), (2,0) -> mean (1,0), unbiased var (1,0)
    # class 1: (0,1), (0,3), (0,2)           -> mean (0,2), unbiased var (0,1)
    emb = np.array([[[1, 0], [0, 0], [2, 0]], [[0, 1], [0, 3], [0, 2]]], dtype=np.float32)
    s = concept_stats(["a", "b"], emb)
    np.testing.assert_allclose(s.mean, [[1, 0], [0, 2]])
    np.testing.assert_allclose(s.var, [[1, 0], [0, 1]])


def test_head_logits_and_surrogate_hand_computed():
    mean = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    var = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    head = ConceptHead(2, mean, var, temperature=2.0)
    with torch.no_grad():  # projection = identity, so f = z / |z|
        head.projection.weight.copy_(torch.eye(2))
        head.projection.bias.zero_()
    z = torch.tensor([[3.0, 4.0]])  # f = (0.6, 0.8)
    # z_0 = 2*0.6 + 0.5*4*(0.36*1) = 1.2 + 0.72 = 1.92 ; z_1 = 2*1.6 + 0.5*4*(0.64*1) = 3.2 + 1.28 = 4.48
    np.testing.assert_allclose(head(z).detach().numpy(), [[1.92, 4.48]], rtol=1e-6)
    # surrogate for y=0: -T mu_0.f + log(e^1.92 + e^4.48) = -1.2 + log(e^1.92 + e^4.48)
    want = -1.2 + math.log(math.exp(1.92) + math.exp(4.48))
    got = float(surrogate_loss(head, z, torch.tensor([0])).detach())
    assert got == pytest.approx(want, rel=1e-6)


def test_surrogate_bounds_the_expected_loss_over_sampled_classifiers():
    """Jensen: E_w[CE(T w f, y)] over w ~ N(mu, s2) <= the surrogate (Monte Carlo, 200k classifiers)."""
    g = torch.Generator().manual_seed(0)
    mean, var = torch.randn(3, 5, generator=g) * 0.3, torch.rand(3, 5, generator=g) * 0.2
    head = ConceptHead(5, mean, var, temperature=3.0)
    z, y = torch.randn(1, 5, generator=g), torch.tensor([1])
    f = head.embed(z).detach()
    w = mean + var.sqrt() * torch.randn(200_000, 3, 5, generator=g)
    logits = 3.0 * torch.einsum("ncd,d->nc", w, f[0])
    mc = float(torch.nn.functional.cross_entropy(logits, y.expand(len(w))))
    sur = float(surrogate_loss(head, z, y).detach())
    assert mc <= sur + 1e-3
    # and the surrogate's penalty is exactly what separates it from CE on the logits
    plain = float(torch.nn.functional.cross_entropy(head(z), y).detach())
    assert sur - plain == pytest.approx(float(head.penalty(f, y)), rel=1e-5)


def test_committed_concepts_and_prompts():
    s = load_concepts(["left_fist", "right_fist"])
    assert s.mean.shape == (2, 384) and (s.var >= 0).all() and (s.var.sum(1) > 0).all()
    assert len(prompts_for("left_fist")) == 16 and "left fist" in prompts_for("left_fist")[0]


def test_empty_class_name_is_refused():
    with pytest.raises(ConceptError, match="empty"):
        load_concepts(["left_fist", ""])
    with pytest.raises(ConceptError, match="empty"):
        get_strategy("fedbm", fedbm_classes="left_fist,")


def test_classifier_class_count_must_match_the_model():
    extras = concept_extras(load_concepts(["left_fist", "right_fist"]), 17.5)
    with pytest.raises(ConceptError, match="2 classes, the model 3"):
        install_head(_model(n_classes=3), extras)
    model = _model()
    install_head(model, extras)
    three = concept_extras(load_concepts(["left_fist", "right_fist", "both_feet"]), 17.5)
    with pytest.raises(ConceptError, match="shape"):
        check_head(model, three)


def test_generator_payload_of_wrong_shape_is_refused():
    st = get_strategy("fedbm", fedbm_gen_every=1, fedbm_gen_iters=1, fedbm_gen_hidden=8)
    model = _model()
    extras = st.setup(model)
    extras = {**extras, "fedbm_gen.ready": torch.tensor(1),
              "fedbm_gen.net.0.weight": torch.zeros(3, 3)}
    X, y = _data()
    state = init_client_state(model.state_dict(), model, st)
    with pytest.raises(ConceptError, match="generator payload"):
        client_update(copy.deepcopy(model), model.state_dict(), state, X, y, st, LocalConfig(), 0,
                      st.downlink_extras(extras))


@pytest.mark.parametrize("bn", ["standard", "batch_specific"])
def test_frozen_classifier_bit_identical_across_rounds(bn):
    overrides = {"bn_mode": bn, "fedbm_gen_every": 1, "fedbm_gen_iters": 2, "fedbm_gen_hidden": 8}
    if bn == "batch_specific":
        overrides |= {"local_bn": True, "sam_rho": 0.1}  # composes with FedBS's BN rule and SAM
    st = get_strategy("fedbm", **overrides)
    model = _model(bn)
    extras = st.setup(model)
    frozen = {k: v.clone() for k, v in extras.items() if k.startswith("fedbm_cls.")}
    server = ServerState({k: v.clone() for k, v in model.state_dict().items()}, extras=extras)
    states = {c: init_client_state(server.global_state, model, st) for c in ("a", "b")}
    worker = copy.deepcopy(model)
    gen_before = extras["fedbm_gen.net.0.weight"].clone()
    for r in range(3):
        updates = []
        for c, seed in (("a", 1), ("b", 2)):
            X, y = _data(seed=seed)
            upd, states[c] = client_update(worker, downlink(server.global_state, st, model), states[c], X, y, st,
                                           LocalConfig(batch_size=8, local_epochs=1), 10 * r + seed,
                                           server_extras_for_clients(server, st))
            assert torch.equal(worker.classifier.mean, frozen["fedbm_cls.mean"])
            updates.append((c, upd))
        server = server_update(server, updates, st, 2)
        for b in ("mean", "var", "temperature"):
            assert torch.equal(server.global_state[f"classifier.{b}"], frozen[f"fedbm_cls.{b}"])
            assert torch.equal(server.extras[f"fedbm_cls.{b}"], frozen[f"fedbm_cls.{b}"])
    assert int(server.extras["fedbm_gen.ready"]) == 1
    assert not torch.equal(server.extras["fedbm_gen.net.0.weight"], gen_before)  # the generator was trained
    assert server.extras["fedbm_gen.cost_bytes"] == sum(
        p.numel() * 4 for p in ConditionalGenerator(384, N_CH, N_T, 8).parameters())
    assert float(server.extras["fedbm_gen.cost_seconds"]) > 0


def test_diversity_loss_hand_computed():
    # class 0: codes (0,0),(1,0) -> |dc|_1 = 1; samples (0,0),(2,2) -> |dx|_1 = 4; 1/(4+1e-5)
    # class 1: one sample -> no pair; mean over 2 classes
    codes = torch.tensor([[0.0, 0.0], [1.0, 0.0], [5.0, 5.0]])
    x = torch.tensor([[0.0, 0.0], [2.0, 2.0], [9.0, 9.0]])
    y = torch.tensor([0, 0, 1])
    assert float(diversity_loss(codes, x, y, 2)) == pytest.approx(0.5 / (4 + 1e-5))


def test_alignment_prior_is_zero_at_the_identity_covariance():
    # 2 trials, 2 channels, T = 4: rows orthogonal with squared norm T -> mean X X^T / T = I
    a = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, -1.0, 1.0, -1.0]])
    x = torch.stack([a, a])
    assert float(alignment_prior_loss(x)) == pytest.approx(0.0, abs=1e-7)
    assert float(alignment_prior_loss(2 * x)) == pytest.approx(math.sqrt(2 * 9) / 2, rel=1e-6)  # 4I - I


def test_generator_losses_use_running_stats_or_the_alignment_prior():
    stats = load_concepts(["left_fist", "right_fist"])
    mean, var = torch.from_numpy(stats.mean), torch.from_numpy(stats.var)
    y = torch.tensor([0, 1, 0, 1])
    for bn in ("standard", "batch_specific"):
        model = _model(bn)
        install_head(model, concept_extras(stats, 17.5))
        model.eval()
        torch.manual_seed(0)
        gen = ConditionalGenerator(384, N_CH, N_T, 8)
        torch.manual_seed(1)
        parts = generator_losses(model, gen, mean, var, y)
        assert set(parts) == {"semantic", "diversity", "distribution"}
        assert all(torch.isfinite(v) and v > 0 for v in parts.values())
        if bn == "batch_specific":
            torch.manual_seed(1)
            from neurofed.trainer.fl.algorithms.fedbm import sample_codes
            _, x = gen(*sample_codes(mean, var, y, gen.noise_dim))
            assert float(parts["distribution"].detach()) == pytest.approx(float(alignment_prior_loss(x).detach()), rel=1e-6)
        parts["semantic"].backward()
        assert gen.net[0].weight.grad is not None  # the semantic term trains the generator


@pytest.mark.slow
@pytest.mark.skipif(not encoder_available(), reason="optional extra fedbm not installed")
def test_committed_embeddings_equal_a_fresh_local_encode():
    from neurofed.trainer.concepts import CONCEPTS, encode_concepts

    with np.load(RESOURCE) as z:
        committed = z["embeddings"]
    fresh = encode_concepts(list(CONCEPTS))
    np.testing.assert_allclose(fresh, committed, atol=1e-5)


def test_concept_head_model_survives_checkpoint_and_onnx_export(tmp_path):
    """A FedBM model (projection + frozen concept classifier) reloads from its checkpoint and exports to ONNX
    with the same logits: the head is rebuilt from the state's shapes, not replaced by a linear layer."""
    from neurofed.export.onnx_export import VerifyReport, to_onnx, verify_against_torch
    from neurofed.trainer.checkpoint import ModelMeta, load_checkpoint, save_checkpoint

    model = _model("batch_specific")
    install_head(model, concept_extras(load_concepts(["left_fist", "right_fist"]), 17.5))
    with torch.no_grad():  # a trained-looking projection, not the initial one
        model.classifier.projection.weight.normal_(0, 0.1)
    meta = ModelMeta(model="eegnet", n_channels=N_CH, n_classes=2, n_times=N_T, sfreq=SF, bn_mode="batch_specific",
                     ch_names=[f"C{i}" for i in range(N_CH)], classes=["left_fist", "right_fist"], strategy="fedbm")
    save_checkpoint(tmp_path / "m.safetensors", model.state_dict(), meta)
    back, _ = load_checkpoint(tmp_path / "m.safetensors")
    assert isinstance(back.classifier, ConceptHead)
    x, _ = _data(8)
    model.eval(), back.eval()
    with torch.no_grad():
        want, got = model(torch.from_numpy(x)), back(torch.from_numpy(x))
    assert torch.equal(want, got)
    report = VerifyReport(subjects=[], held_out=True, n_trials=len(x))
    verify_against_torch(back, to_onnx(back, N_CH, N_T).SerializeToString(), x, report)
    assert max(report.max_abs_diff.values()) <= 1e-4 and not any(report.class_mismatches.values())  # else it raises


def test_a_plain_checkpoint_keeps_its_linear_head():
    from neurofed.trainer.models.heads import install_concept_head_for

    model = _model()
    assert not install_concept_head_for(model, model.state_dict())
    assert isinstance(model.classifier, torch.nn.Linear)


def test_pseudo_trials_do_not_move_bn_running_statistics():
    """The clients' pseudo-trial pass trains through standard BN without updating its running statistics (the
    held-out subjects are decoded with them; pseudo batches would pull them towards the generator's)."""
    from neurofed.trainer.fl.algorithms.fedbm import _GeneratorHook

    model = _model("standard")
    model.train()
    torch.manual_seed(1)
    mean, var = torch.randn(2, 16), torch.rand(2, 16)
    hook = _GeneratorHook(model, ConditionalGenerator(16, N_CH, N_T, 8), mean, var, mix=8)
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    loss = hook.loss_term(torch.zeros(8, N_CH, N_T), None)
    assert loss is not None and loss.requires_grad
    after = model.state_dict()
    assert before and all(torch.equal(after[k], v) for k, v in before.items())
    model(torch.randn(8, N_CH, N_T))  # a real batch still updates them
    assert not all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
