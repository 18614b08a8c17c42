"""A 3-round federation over a real broker with real processes equals the in-process simulation."""

from __future__ import annotations

import os

import pytest
import torch
from neurofed.trainer.experiments.runner import run_federated
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.fl.strategies import get_strategy
from safetensors.torch import load_file

from tests.broker.conftest import child_env, kill_all, start_coordinator, start_edge, wait_all, write_toml


def reference_state(subjects, rounds: int, fraction: float, seed: int, strategy: str,
                    overrides: dict | None = None) -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    clients = {sd.subject: sd for sd in subjects}
    model, _ = run_federated(clients, "eegnet", get_strategy(strategy, **(overrides or {})),
                             LocalConfig(batch_size=16, local_epochs=1), rounds, fraction, seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


#: FedBM: the frozen classifier from the coordinator's setup rides in every task, the generator (trained after
#: round 2, used in round 3) too; composed with FedBS's rule (local batch-specific BN) + SAM and with SAFE's FAT
GEN = {"fedbm_gen_every": 2, "fedbm_gen_iters": 3}
CASES = [("fedbs", 0.5, {}), ("ga", 1.0, {}), ("fedfa", 0.5, {}), ("fedbm", 0.5, GEN),
         ("fedbm", 0.5, {"fedbm_gen_every": 0}), ("fedbs", 0.5, {"fedbm_temperature": 17.5, **GEN}),
         ("safe", 0.5, {"fedbm_temperature": 17.5, **GEN})]


def overrides_toml(overrides: dict) -> str:
    if not overrides:
        return ""
    return "[federation.strategy_overrides]\n" + "".join(f"{k} = {v!r}\n" for k, v in overrides.items())


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "fraction", "overrides"), CASES,
                         ids=["fedbs", "ga", "fedfa", "fedbm", "fedbm-nogen", "fedbs+fedbm", "safe+fedbm"])
def test_mqtt_federation_matches_in_process(subjects4, mosquitto, fed_name, tmp_path, strategy, fraction, overrides):
    # GA: per-client weights keyed by the sender's id and the run's rounds; FedFA: statistics up and down
    cfg = write_toml(tmp_path / "federation.toml", fed_name, rounds=3, fraction=fraction, min_clients=4,
                     strategy=strategy, extra=overrides_toml(overrides))
    env = child_env(os.environ.get("NEUROFED_CACHE") and __import__("pathlib").Path(os.environ["NEUROFED_CACHE"]))
    out = tmp_path / "out"
    coord = start_coordinator(mosquitto.url, cfg, out, tmp_path / "coord.log", env)
    edges = [start_edge(mosquitto.url, fed_name, s, tmp_path / "state", tmp_path / f"edge{s}.log", env)
             for s in (1, 2, 3, 4)]
    try:
        codes = wait_all([coord], 240)
        assert codes == [0], (tmp_path / "coord.log").read_text()[-3000:]
        assert wait_all(edges, 30) == [0, 0, 0, 0], [(tmp_path / f"edge{s}.log").read_text()[-1500:] for s in (1, 2, 3, 4)]
    finally:
        kill_all([coord, *edges])
    got = load_file(str(out / "global_model.safetensors"))
    want = reference_state(subjects4, 3, fraction, 7, strategy, overrides)
    assert got.keys() == want.keys()
    diff = max(float((got[k].double() - want[k].double()).abs().max()) for k in want)
    assert diff <= 1e-6, f"max abs diff {diff}"
    # and the weights really moved away from the initial model
    from neurofed.broker.config import load_config
    from neurofed.broker.coordinator import initial_model

    init = initial_model(load_config(cfg)).state_dict()  # before a strategy's setup (FedBM: the plain head)
    assert max(float((got[k] - init[k]).abs().max()) for k in init if k in got) > 1e-3
