"""Federated learning maths as pure functions over state dicts (no transport).

* :mod:`neurofed.trainer.fl.strategies` — what each algorithm is (BN mode, local BN rule, regularisers).
* :mod:`neurofed.trainer.fl.local` — the local training loop (SGD + SAM / FGSM-AT / AWP / FedProx / SCAFFOLD / MOON).
* :mod:`neurofed.trainer.fl.client` — one client's round: apply the downlink, train, build the update.
* :mod:`neurofed.trainer.fl.server` — selection, downlink, streaming weighted aggregation, server state.

The in-process simulation (:mod:`neurofed.trainer.experiments`) and the MQTT coordinator/edge client call
exactly these functions, so both produce the same weights for the same seeds.
"""
