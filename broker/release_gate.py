"""Federated validation and the release gate of a long-lived federation (``[release]``, docs/howto/long-lived-federation.md).

Every ``release.every`` model versions the coordinator asks the clients that validate (``edge-client join
--evaluate``: they never train here, so their trials are held out) to evaluate the version as a **candidate**, and
the current release beside it (one retained :class:`~neurofed.broker.protocol.EvalMsg`). Each answers with the
balanced accuracy (BCA) of both on its own trials and its trial counts (:class:`~neurofed.broker.protocol.EvalReportMsg`,
never trials). When every validating client online at the request answered, or at ``release.wait_s``, the gate
decides: the candidate becomes release ``n + 1`` only if at least ``release.min_clients`` clients reported and the
mean of the per-client paired differences ``bca(candidate) - bca(release)`` is at least ``-release.margin`` (no
release yet: any candidate validated by enough clients). Every decision, released or not, is recorded with its
statistics in ``history.json`` of the release folder (:func:`read_history`; ``neurofed release list`` shows it), and
a release's weights are kept beside it (``vNNNN.safetensors``: the next candidates are compared with it, also after
a restart).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from torch import Tensor

from neurofed.broker.protocol import EvalReportMsg
from neurofed.broker.registry import Registry
from neurofed.broker.validation import Rejected
from neurofed.trainer.atomic import atomic_write_bytes, save_safetensors

__all__ = ["Evaluation", "ReleaseGate", "paired_stats", "read_history"]

HISTORY = "history.json"


def read_history(folder: str | Path) -> list[dict[str, Any]]:
    """The gate's decisions kept in ``folder`` (oldest first; [] when none)."""
    p = Path(folder) / HISTORY
    return json.loads(p.read_text()) if p.is_file() else []


def paired_stats(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Mean BCA of the candidate (per client, and weighted by trials), of the release, and the paired difference
    (mean, standard error over clients) of the clients that evaluated both."""
    bca = [r["bca"] for r in reports.values()]
    n = [r["n_trials"] for r in reports.values()]
    out: dict[str, Any] = {
        "n_clients": len(bca), "n_trials": int(sum(n)),
        "bca_mean": sum(bca) / len(bca) if bca else None,
        "bca_weighted": sum(b * k for b, k in zip(bca, n)) / sum(n) if bca else None,
    }
    pairs = [(r["bca"], r["bca_release"]) for r in reports.values() if r.get("bca_release") is not None]
    if pairs:
        d = [a - b for a, b in pairs]
        m = sum(d) / len(d)
        sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1)) if len(d) > 1 else None
        out.update(release_bca_mean=sum(b for _, b in pairs) / len(pairs), paired_diff_mean=m,
                   paired_diff_se=None if sd is None else sd / math.sqrt(len(d)), n_paired=len(d))
    return out


@dataclass
class Evaluation:
    """One open evaluation request."""

    eval_id: str
    version: int
    release: int  # the release the candidate is compared with (0: none)
    deadline: float
    expected: int  # validating clients online when it was asked
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)


class ReleaseGate:
    """The release history and the open evaluation of one coordinator.

    Parameters
    ----------
    folder : path
        Release folder: ``history.json``, ``vNNNN.safetensors`` (a release's weights) and, when releases are
        published, the signed graphs (:class:`neurofed.broker.releases.ReleaseStore`).
    min_clients, margin, wait_s :
        ``[release]`` settings (see the module docstring).
    """

    def __init__(self, folder: str | Path, min_clients: int, margin: float, wait_s: float) -> None:
        self.folder = Path(folder)
        self.min_clients, self.margin, self.wait_s = min_clients, margin, wait_s
        self.history = read_history(self.folder)
        self.open: Evaluation | None = None
        released = [h for h in self.history if h.get("released")]
        self.current: int = released[-1]["release"] if released else 0
        self.current_version: int | None = released[-1]["version"] if released else None
        self.current_state: dict[str, Tensor] | None = None
        if self.current and (p := self.state_path(self.current)).is_file():
            self.current_state = load_file(str(p))
        self.candidate_state: dict[str, Tensor] | None = None
        self._lock = threading.Lock()  # history.json is rewritten by the loop and by the release worker thread

    def state_path(self, number: int) -> Path:
        return self.folder / f"v{number:04d}.safetensors"

    def next_number(self, at_least: int = 0) -> int:
        return max(self.current, at_least - 1) + 1

    def ask(self, eval_id: str, version: int, state: dict[str, Tensor], evaluators: int) -> dict[str, Tensor]:
        """Open an evaluation of ``version``; returns the request's body (``cand.*`` and ``rel.*``)."""
        self.open = Evaluation(eval_id, version, self.current if self.current_state is not None else 0,
                               time.monotonic() + self.wait_s, evaluators)
        self.candidate_state = {k: v.clone() for k, v in state.items()}
        body = {f"cand.{k}": v for k, v in state.items()}
        if self.current_state is not None:
            body.update({f"rel.{k}": v for k, v in self.current_state.items()})
        return body

    def offer(self, msg: EvalReportMsg, registry: Registry) -> None:
        """Keep one client's report of the open evaluation; :class:`Rejected` otherwise."""
        ev = self.open
        if ev is None or msg.eval_id != ev.eval_id:
            raise Rejected("late", f"report for evaluation {msg.eval_id[:8]}, which is not open")
        info = registry.clients.get(msg.sender)
        if info is None:
            raise Rejected("not_joined", f"{msg.sender} has not joined this run")
        if msg.sender in ev.reports:
            raise Rejected("duplicate", f"{msg.sender} already reported evaluation {ev.eval_id[:8]}")
        if msg.version != ev.version:
            raise Rejected("wrong_task", f"report of version {msg.version}, the candidate is version {ev.version}")
        if msg.n_trials > info.n_trials or sum(msg.class_counts) != msg.n_trials:
            raise Rejected("bad_count", f"{msg.n_trials} trials (class counts {msg.class_counts}), joined with "
                           f"{info.n_trials}")
        if (msg.bca_release is None) != (ev.release == 0):
            raise Rejected("bad_message", "bca_release must be given exactly when a release was sent")
        ev.reports[msg.sender] = {"n_trials": msg.n_trials, "class_counts": list(msg.class_counts), "bca": msg.bca,
                                  "bca_release": msg.bca_release}

    def due(self, now: float | None = None) -> bool:
        """The open evaluation can be decided: every validating client online at the request answered, or its
        time is up."""
        ev = self.open
        if ev is None:
            return False
        now = time.monotonic() if now is None else now
        return now >= ev.deadline or (ev.expected > 0 and len(ev.reports) >= ev.expected)

    def decide(self, number: int | None = None, private: bool = False,
               save: Callable[[Path, dict[str, Tensor]], Any] | None = None, **extra: Any) -> dict[str, Any]:
        """Close the open evaluation: the record of the decision (``released`` and, if so, ``release``). The caller
        passes ``number`` (the signed release's version when it publishes) after :meth:`passes`; the record is
        appended to the history and the released weights kept (``save(path, state)``, default plain safetensors)."""
        ev = self.open
        assert ev is not None and self.candidate_state is not None
        stats = paired_stats(ev.reports)
        ok, why = self.passes(stats)
        rec: dict[str, Any] = {
            "candidate_version": ev.version, "version": ev.version, "released": ok and number is not None,
            "release": number if ok else None, "parent": self.current or None,
            "parent_version": self.current_version, "reason": why, "margin": self.margin,
            "min_clients": self.min_clients, "decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **stats, **extra,
            "clients": ([] if private else sorted(ev.reports)),
            "counts": ([r["n_trials"] for _, r in sorted(ev.reports.items())] if private else
                       {c: r["n_trials"] for c, r in sorted(ev.reports.items())}),
            "per_client": [] if private else [{"client": c, **r} for c, r in sorted(ev.reports.items())],
        }
        if rec["released"]:
            self.folder.mkdir(parents=True, exist_ok=True)
            (save or _save_plain)(self.state_path(number), self.candidate_state)  # type: ignore[arg-type]
            self.current, self.current_version = number, ev.version  # type: ignore[assignment]
            self.current_state = self.candidate_state
        with self._lock:
            self.history.append(rec)
            self._save()
        self.open, self.candidate_state = None, None
        return rec

    def note(self, rec: dict[str, Any], **fields: Any) -> None:
        """Add ``fields`` to a decision record of the history (e.g. its signature, once published) and save it."""
        with self._lock:
            rec.update(fields)
            self._save()

    def _save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.folder / HISTORY, json.dumps(self.history, indent=1).encode())

    def passes(self, stats: dict[str, Any] | None = None) -> tuple[bool, str]:
        """Whether the open evaluation's candidate may become a release, and why (one line)."""
        assert self.open is not None
        s = stats or paired_stats(self.open.reports)
        if s["n_clients"] < self.min_clients:
            return False, f"validated by {s['n_clients']} client(s), fewer than min_clients {self.min_clients}"
        if self.current_state is None:
            return True, f"first release: mean BCA {s['bca_mean']:.4f} over {s['n_clients']} clients"
        d = s.get("paired_diff_mean")
        if d is None:
            return False, "no client compared the candidate with the current release"
        if d < -self.margin:
            return False, f"mean paired BCA difference {d:+.4f} is worse than -margin {-self.margin:g}"
        return True, f"mean paired BCA difference {d:+.4f} >= -margin {-self.margin:g} over {s['n_paired']} clients"



def _save_plain(path: Path, state: dict[str, Tensor]) -> None:
    save_safetensors(path, {k: v.contiguous() for k, v in state.items()})
