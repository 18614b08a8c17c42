"""``neurofed demo``: the whole product end to end on one machine, with no external service.

Broker -> simulated headsets -> on-device capture -> federated training over MQTT -> ONNX export ->
live decoding of several held-out subjects -> offline/attack evaluation -> run directory with a report.
The phases are in :mod:`neurofed.demo_run`; this module holds the configuration (the command: :mod:`neurofed.cli`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from neurofed.trainer.data.eegmmidb import parse_subjects
from neurofed.trainer.errors import NeuroFedError
from neurofed.trainer.fl.local import LocalConfig

LOCAL = LocalConfig()  # the published protocol: one definition for simulate, the demo and the coordinator


@dataclass(frozen=True)
class DemoConfig:
    """Everything a demo run needs (written to ``config.json`` in the run directory).

    Parameters
    ----------
    subjects : list of int
        EEGMMIDB subjects whose headsets train (one edge client each).
    heldout : list of int
        Subjects streamed live to the exported model after training (never trained on). The default
        follows :data:`HELDOUT_RULE`, fixed before any result was seen.
    algorithm : str
        ``fedbs`` or ``safe``.
    rounds, fraction, batch_size, local_epochs : federation schedule. A quarter of 32 clients (8) per
        round rather than the papers' half: the same compute per round as half of 16 clients, with twice
        the subjects to generalise from (experiments/demo_sizing/).
    lr : float
        Client SGD learning rate. Batch size, local epochs and lr default to the published protocol's
        single definition (:class:`neurofed.trainer.fl.local.LocalConfig`): 0.05, not the papers' 0.005, which with
        45 trials per client leaves the model at chance for 100 rounds (docs/BENCHMARKS.md).
    speed : float
        Playback speed of the training headsets (capture phase).
    live_speed : float
        Playback speed of the held-out headset (live phase).
    eps : list of float
        FGSM budgets (x per-channel std) for the BCA-vs-epsilon curve of the exported model.
    broker : str or None
        ``mqtt://host:port`` of an existing broker; None starts the embedded one on a free port.
    """

    subjects: list[int] = field(default_factory=lambda: parse_subjects(DEFAULT_SUBJECTS, None))
    heldout: list[int] = field(default_factory=lambda: parse_subjects(DEFAULT_HELDOUT, None))
    heldout_rule: str = ""
    algorithm: str = "fedbs"
    rounds: int = 40
    fraction: float = 0.25
    batch_size: int = LOCAL.batch_size
    local_epochs: int = LOCAL.local_epochs
    lr: float = LOCAL.lr
    channels: str = "sensorimotor21"
    resample: float = 80.0
    speed: float = 20.0
    live_speed: float = 20.0
    runs: str = "4,8,12"
    eps: list[float] = field(default_factory=lambda: [0.01, 0.03, 0.05])
    attack: str = "fgsm"
    broker: str | None = None
    data_dir: str | None = None
    out: str = ""
    seed: int = 0
    round_deadline_s: float = 90.0
    time_budget_s: float = 900.0

    def __post_init__(self) -> None:
        if self.algorithm not in ("fedbs", "safe"):
            raise NeuroFedError(f"--algorithm {self.algorithm!r}: use fedbs or safe")
        if len(self.subjects) < 2:
            raise NeuroFedError("the demo needs at least 2 training subjects")
        if not self.heldout:
            raise NeuroFedError("the demo needs at least one held-out subject")
        if both := sorted(set(self.heldout) & set(self.subjects)):
            raise NeuroFedError(f"held-out subject(s) {both} are also training subjects")
        if self.rounds < 1 or not 0 < self.fraction <= 1 or self.speed <= 0 or self.live_speed <= 0:
            raise NeuroFedError("rounds >= 1, 0 < fraction <= 1 and speeds > 0 are required")

    def to_dict(self) -> dict:
        return asdict(self)


#: Training headsets of the default demo: the first 32 subjects of the shared 46-subject set.
DEFAULT_SUBJECTS = "1-19,24-36"
#: Held-out subjects of the default demo: the last 4 of the shared set (see HELDOUT_RULE).
DEFAULT_HELDOUT = "47-50"
#: How the default held-out subjects were chosen (written into report.md).
HELDOUT_RULE = ("the last 4 subjects of the shared 46-subject EEGMMIDB set (S001-S019, S024-S050), i.e. "
                "S047-S050, fixed before any demo result was seen; the training headsets are the first subjects "
                "of the same set")
