"""Federated classical pipelines (issue 57): EA + CSP + LDA and the Riemannian tangent space + LDA from summed
sufficient statistics, exact against the centralised pipelines, in two rounds.

The models (:mod:`neurofed.trainer.models.classical`) carry their statistics in ``stat_*`` buffers of the state
dict, normalised by the client's trial count: the server's ordinary trial-weighted mean of the states (or the
unmasked sum of secure aggregation, which computes the same mean blind) times the round's trials is the pooled
sum, and :class:`SufficientStatistics`'s server rule turns it into the pipeline's parameters. No tensor travels
beside the state, the aggregation rule is the plain weighted mean: secure aggregation applies as for FedAvg.

Every client must take part in each of the two rounds (a sum over half the clients would be another estimate):
the algorithms default to ``--fraction 1 --rounds 2`` (rounds after the second change nothing).

Client-level DP (``classical_dp_clip`` > 0): each client clips its phase's statistics vector to L2 norm
``clip`` before it leaves; the server adds ``N(0, (z clip)^2)`` per coordinate of the sum. With every client in
each of the two releases the accountant composes two Gaussian mechanisms (dp-accounting's RDP accountant, the
one DP-FedAvg uses, :func:`neurofed.trainer.fl.algorithms.dp.dp_epsilon` with sampling rate 1);
``classical_dp_epsilon`` picks the smallest ``z`` that meets an (epsilon, ``dp_delta``) target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from neurofed.trainer.fl.algorithms.dp import dp_epsilon, dp_epsilon_of, noise_for_epsilon
from neurofed.trainer.fl.api import Algorithm, Component, Param, ServerRound
from neurofed.trainer.models.classical import STATISTICS_MODELS, DPSpec, model_from_state, solve_state


class _StatisticsRound(ServerRound):
    def __init__(self, dp: DPSpec, shrinkage: float) -> None:
        self.dp, self.shrinkage, self.trials = dp, shrinkage, 0

    def add(self, extras: Mapping[str, Tensor], n_samples: int) -> None:
        self.trials += int(n_samples)

    def finish(self, old_global, new_global, extras, n_updates):
        model = model_from_state(old_global)
        return solve_state(model, old_global, new_global, float(self.trials), self.dp, 0, self.shrinkage), extras


class SufficientStatistics(Component):
    """The server rule of the statistics models (and their client-level DP)."""

    PARAMS = (
        Param("classical", str, "", "pipeline fitted from summed statistics (fed-csp-lda, fed-tangent)",
              choices=("", *STATISTICS_MODELS), minimum=None),
        Param("classical_shrinkage", float, 0.0, "federated classical pipelines: LDA shrinkage s (scikit-learn's "
              "lsqr solver; 0 = its svd solver, no shrinkage)"),
        Param("classical_dp_clip", float, 0.0, "federated classical pipelines: L2 clip of each client's statistics "
              "in the first round (0 = DP off)"),
        Param("classical_dp_clip_lda", float, 0.0, "federated classical pipelines: L2 clip of the LDA round's "
              "statistics (0 = classical_dp_clip)"),
        Param("classical_dp_noise", float, 0.0, "federated classical pipelines: Gaussian noise multiplier z "
              "(std z*clip on each pooled sum)"),
        Param("classical_dp_epsilon", float, 0.0, "federated classical pipelines: target epsilon (at dp_delta): "
              "sets the noise multiplier (overrides classical_dp_noise; needs classical_dp_clip)"),
        Param("classical_dp_count_weight", float, 1.0, "federated classical pipelines: weight of the class counts "
              "in the clipped vector (their noise is divided by it; 0 = counts public: neither clipped nor noised)"),
        Param("classical_dp_lda_share", float, 0.5, "federated classical pipelines: share of the privacy budget "
              "(RDP, proportional to 1/z^2) spent on the LDA round (0.5 = the same z in both rounds)",
              minimum=1e-3),
        Param("classical_dp_ea_sum", bool, False, "federated classical pipelines, fed-csp-lda: release only class 0's "
              "centred covariance sum (EA makes class 1's its negative)"),
    )
    KEY = "classical"
    needs_every_client = True
    PHASES = 2

    def __init__(self, pipeline: str, dp: DPSpec, delta: float, shrinkage: float = 0.0) -> None:
        self.pipeline, self.dp, self.delta, self.shrinkage = pipeline, dp, delta, shrinkage

    @classmethod
    def build(cls, settings: Mapping[str, Any]) -> SufficientStatistics | None:
        if not settings["classical"]:
            if settings["classical_dp_clip"] > 0 or settings["classical_dp_epsilon"] > 0:
                raise ValueError("classical_dp_* apply to the federated classical pipelines (fed-csp-lda, fed-tangent)")
            return None
        if settings["aggregator"] != "mean" or settings["clip_mult"] > 0 or settings["dp_clip"] > 0:
            raise ValueError(f"{settings['classical']}: summed statistics need the plain weighted mean (aggregator "
                             "mean, clip_mult 0, no dp_clip; DP of the statistics is classical_dp_clip)")
        clip, noise, eps = settings["classical_dp_clip"], settings["classical_dp_noise"], settings["classical_dp_epsilon"]
        if (noise > 0 or eps > 0) and clip <= 0:
            raise ValueError("classical_dp_noise / classical_dp_epsilon need classical_dp_clip > 0 (the noise is "
                             "calibrated to the clip)")
        if eps > 0:
            noise = noise_for_epsilon(eps, 1.0, cls.PHASES, settings["dp_delta"])
        share = settings["classical_dp_lda_share"]
        if not 0 < share < 1:
            raise ValueError(f"classical_dp_lda_share must be in (0, 1), got {share}")
        noise_lda = 0.0
        if share != 0.5 and noise > 0:  # the same total RDP as z in both rounds: 1/z1^2 + 1/z2^2 = 2/z^2
            noise, noise_lda = noise / math.sqrt(2 * (1 - share)), noise / math.sqrt(2 * share)
        if settings["classical_dp_ea_sum"] and settings["classical"] != "csp_lda":
            raise ValueError("classical_dp_ea_sum applies to fed-csp-lda (its class covariance sums)")
        return cls(settings["classical"], DPSpec(clip, noise, settings["classical_dp_count_weight"],
                                                 settings["dp_seed"], settings["classical_dp_clip_lda"], noise_lda,
                                                 settings["classical_dp_ea_sum"]),
                   settings["dp_delta"],
                   settings["classical_shrinkage"])

    def server_round(self, server_extras: Mapping[str, Tensor], n_clients_total: int) -> ServerRound:
        return _StatisticsRound(self.dp, self.shrinkage)

    def report(self, n_clients_total: int, per_round: int, rounds: int) -> dict[str, Any]:
        if not self.dp.on:
            return {}
        releases = min(rounds, self.PHASES)
        extra: dict[str, Any] = {}
        if self.dp.noise_lda > 0 or self.dp.ea_sum:  # keys of the options beyond the first study's
            extra = {"noise_multiplier_lda": self.dp.noise_of(1), "ea_sum": self.dp.ea_sum}
        noises = [self.dp.noise_of(p) for p in range(releases)]
        eps = (dp_epsilon(self.dp.noise, 1.0, releases, self.delta) if len(set(noises)) <= 1
               else dp_epsilon_of(noises, self.delta))
        return {"privacy": {"mechanism": "client-level Gaussian noise on clipped summed statistics "
                                         "(federated classical pipeline)",
                            "clip": self.dp.clip, "clip_lda": self.dp.clip_of(1), "noise_multiplier": self.dp.noise, "sample_rate": 1.0,
                            "rounds": releases, "delta": self.delta, "count_weight": self.dp.count_weight,
                            "epsilon": eps, **extra,
                            "accountant": "dp-accounting RDP, Gaussian mechanism composed over the releases"}}


FED_CSP_LDA = Algorithm("fed-csp-lda", "EA + CSP + LDA from summed class covariances and feature statistics "
                        "(2 rounds, every client; exact vs the centralised pipeline)", (SufficientStatistics,),
                        {"classical": "csp_lda", "clip_mult": 0.0}, reference="Ramoser et al., IEEE TRE 2000 (CSP); MNE-Python")
FED_TANGENT = Algorithm("fed-tangent", "EA + OAS covariances + tangent space at the log-Euclidean mean + LDA from "
                        "summed statistics (2 rounds, every client; exact vs pyriemann + scikit-learn)",
                        (SufficientStatistics,), {"classical": "tangent_lda", "classical_shrinkage": 0.5, "clip_mult": 0.0},
                        reference="Barachant et al., IEEE TBME 2012 (tangent space); pyRiemann")

#: the model each classical algorithm trains (``neurofed simulate --algorithm`` picks it)
CLASSICAL_MODELS: dict[str, str] = {FED_CSP_LDA.name: "csp_lda", FED_TANGENT.name: "tangent_lda"}
