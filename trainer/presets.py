"""Named experiment settings: ``published`` (the default everywhere) and ``paper`` (the papers' own).

One definition: the published protocol's optimiser is :class:`neurofed.trainer.fl.local.LocalConfig`'s
defaults; this module adds the schedule and the input format around it. ``neurofed simulate
--preset NAME`` starts from a preset and any explicit option overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from neurofed.trainer.fl.local import LocalConfig


@dataclass(frozen=True)
class Preset:
    """Training schedule + input format.

    Attributes
    ----------
    name, summary : str
    local : LocalConfig
        Client optimiser (CT uses it with ``ct_batch_size``).
    rounds : int
        Communication rounds (CT: epochs).
    fraction : float
        Clients per round.
    ct_batch_size : int
    channels : str
        Channel preset (``sensorimotor21``, ``all``) or a comma list.
    resample : float or None
        Hz (None keeps the recording's 160 Hz).
    caveat : str
        What to know before using it (printed when it is chosen).
    """

    name: str
    summary: str
    local: LocalConfig = field(default_factory=LocalConfig)
    rounds: int = 50
    fraction: float = 0.5
    ct_batch_size: int = 64
    channels: str = "sensorimotor21"
    resample: float | None = 80.0
    caveat: str = ""


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("published", "NeuroFed's published protocol: 21 sensorimotor channels at 80 Hz, 50 rounds, half the "
           "clients, 2 local epochs, client batch 8, SGD lr 0.05 (momentum 0.9, wd 1e-4); CT batch 64"),
    Preset("paper", "the FedBS/SAFE papers' settings: all 64 channels at 160 Hz, 200 rounds, half the clients, "
           "2 local epochs, client batch 32, SGD lr 0.005", LocalConfig(lr=0.005, batch_size=32), rounds=200,
           ct_batch_size=32, channels="all", resample=None,
           caveat="the papers had 288-576 trials per client; an EEGMMIDB client has 45, so batch 32 gives ~3 SGD "
                  "steps per round and lr 0.005 leaves training at chance for 100+ rounds (studies/table30/README.md, "
                  "'The local-step budget'). Use it to reproduce the papers' setting, not to train."),
)}
DEFAULT = PRESETS["published"]


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]
