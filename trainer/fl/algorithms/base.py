"""Algorithms that are only a BN rule over weighted averaging: CT, FedAvg, FedBN."""

from __future__ import annotations

from neurofed.trainer.fl.algorithms.swa import WeightAverage
from neurofed.trainer.fl.api import BN_MODES, BN_SYNC, Algorithm, Param

#: the BN rule's settings (every strategy has them; see :class:`neurofed.trainer.fl.api.Strategy`)
BN_PARAMS = (
    Param("bn_mode", str, "standard", "BatchNorm statistics: standard (running) or batch_specific (FedBS/SAFE)",
          choices=BN_MODES, minimum=None),
    Param("local_bn", bool, False, "BN entries are not sent down: each client trains with its own BN",
          flag="--local-bn/--shared-bn"),
    Param("local_bn_mode", str, "", "BatchNorm statistics of fleeg_eegnet's per-device module (local.*): standard "
          "or batch_specific; empty = bn_mode", choices=("", *BN_MODES), minimum=None),
    Param("bn_sync", str, "local", "local (paper): a client keeps its BN; stale_global (authors' code): the last "
          "aggregated BN is sent down", choices=BN_SYNC, minimum=None),
    # a construction parameter of the deep models, carried like local_bn_mode (Strategy.model_kwargs) so that the
    # simulation, the coordinator, every edge client and the checkpoint build the same network
    Param("dropout", float, -1.0, "dropout probability of a deep model's dropout layers; -1 = the model's own "
          "(EEGNet 0.5, Lawhern et al.'s within-subject value; 0.25 is their cross-subject value)", minimum=-1.0),
)

CT = Algorithm("ct", "centralised training on the pooled trials (the upper reference, not federated)",
               centralised=True)
# FedAvg brings the server-side weight average (``swa_decay``, off by default) that any algorithm may switch on
FEDAVG = Algorithm("fedavg", "weighted averaging of full state dicts (trial-count weights)", (WeightAverage,),
                   reference="McMahan et al., AISTATS 2017")
FEDBN = Algorithm("fedbn", "FedAvg, BN entries stay on the clients", settings={"local_bn": True},
                  reference="Li et al., ICLR 2021")
