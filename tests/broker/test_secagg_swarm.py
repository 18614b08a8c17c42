"""SecAgg+ with a sparse neighbour graph over a real Mosquitto: 12 lightweight clients (no training), k = 4."""

from __future__ import annotations

import threading

from neurofed.bench_secagg import SecAggSwarm
from neurofed.broker.config import config_from_dict
from neurofed.broker.coordinator import Coordinator
from neurofed.trainer.fl.secagg import masked_keys
from neurofed.wiretap import EegFingerprint, Wiretap, audit


def _round(url: str, name: str, tmp, drop: frozenset[str], n: int = 12, k: int = 4) -> tuple[Coordinator, SecAggSwarm]:
    cfg = config_from_dict({"federation": {"name": name, "rounds": 1, "fraction": 1.0, "min_clients": n,
                                           "round_deadline_s": 60, "strategy": "fedbs", "join_timeout_s": 60,
                                           "strategy_overrides": {"clip_mult": 0.0}, "secure_aggregation": True},
                            "secagg": {"neighbours": k, "phase_s": 4.0}, "output": {"dir": str(tmp / name)}})
    coord = Coordinator(cfg, url)
    tap = Wiretap(url, name).start()
    stop = threading.Event()
    ct = threading.Thread(target=coord.run, kwargs={"stop": stop}, daemon=True)
    ct.start()
    swarm = SecAggSwarm(url, name, n, drop_after_shares=drop)
    swarm.wait_model()
    swarm.join(coord.spec)
    st = threading.Thread(target=swarm.serve, args=(stop,), daemon=True)
    st.start()
    ct.join(120)
    stop.set()
    st.join(10)
    swarm.close()
    tap.stop()
    assert not ct.is_alive() and coord.server.round == 1
    coord.tap = tap
    return coord, swarm


def test_sparse_graph_round_with_a_dropout_is_exact(mosquitto, fed_name, tmp_path):
    gone = "sim0005"
    coord, swarm = _round(mosquitto.url, fed_name, tmp_path, frozenset({gone}))
    m = coord.metrics[0]["secagg"]
    assert (m["k"], m["t"], m["roster"], m["shared"], m["masked"], m["revealed"]) == (4, 3, 12, 12, 11, 11), m
    assert coord.metrics[0]["participants"] == [c for c in swarm.ids if c != gone]
    # FedBS: the clients' BN entries are summed too (the server's BN is what the final model evaluates with)
    g = coord.server.global_state
    keys = masked_keys(g)
    keep = [c for c in swarm.ids if c != gone]
    want = {k: sum(swarm.updates[c][k].double() for c in keep) / len(keep) for k in keys}  # equal trial counts
    diff = max(float((g[k].double() - want[k]).abs().max()) for k in keys)
    assert diff <= 1e-6, diff
    assert max(float((swarm.updates[gone][k].double() - want[k]).abs().max()) for k in keys) > 1e-4
    # the demo's wire audit accepts the secagg messages (schema, topic, and a masked int32 body of the right size)
    specs = {k: (tuple(v.shape), str(v.dtype)) for k, v in g.items()}
    res = audit(coord.tap, specs, EegFingerprint([]))
    assert res.ok and res.messages > 12 * 4, res.to_dict()
    # every client talked to its 4 neighbours only: O(n k) shares, not O(n^2)
    assert all(len(s.neighbours) == 4 and len(s.keys) == 4 for s in swarm.sessions.values())


def test_a_round_that_cannot_be_unmasked_is_refused_and_reissued(mosquitto, fed_name, tmp_path):
    """k = t = 2: when a client vanishes after sharing, its two neighbours keep 1 surviving neighbour < t, so they
    refuse to reveal (the sum would be too small to hide anything) and its key cannot be rebuilt: the coordinator
    gives the attempt up and re-issues the round to the clients still online, which completes it exactly."""
    gone = "sim0002"
    coord, swarm = _round(mosquitto.url, fed_name, tmp_path, frozenset({gone}), n=6, k=2)
    assert swarm.tasks == 2 and len(swarm.refused) == 2, swarm.refused
    assert all("threshold is 2" in r for r in swarm.refused)
    m = coord.metrics[0]
    keep = [c for c in swarm.ids if c != gone]
    assert m["participants"] == keep and m["secagg"]["failure"] is None and m["secagg"]["roster"] == 5
    g = coord.server.global_state
    keys = masked_keys(g)
    want = {k: sum(swarm.updates[c][k].double() for c in keep) / len(keep) for k in keys}
    assert max(float((g[k].double() - want[k]).abs().max()) for k in keys) <= 1e-6
