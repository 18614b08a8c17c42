"""Child process of ``neurofed demo``: simulated headsets (firmware_sim) that start streaming only once read.

Like ``headset-sim``, but each headset waits (bounded) for an inlet on its EEG and marker streams and
then a short lead-in before its first sample, so no cued trial is lost while the edge clients
connect (and, with ``--go-file``, until the demo says every consumer is ready).
Usage: ``python -m neurofed.headsets --subjects 1,2 --name NAME --speed 20 [--data-dir D] [--go-file F]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from firmware_sim.player import HeadsetPlayer, PlayerConfig, run_to_end
from firmware_sim.recording import load_eegmmidb
from trainer.errors import NeuroFedError


class LeadInPlayer(HeadsetPlayer):
    """A headset that, after its consumers attached, waits ``lead_in`` seconds more before streaming."""

    lead_in = 1.0
    go_file: Path | None = None
    go_timeout = 60.0

    def _wait_consumers(self) -> None:
        first = not getattr(self, "_started_once", False)
        super()._wait_consumers()
        if first:
            self._started_once = True
            time.sleep(self.lead_in)
            end = time.monotonic() + self.go_timeout
            while self.go_file is not None and not self.go_file.exists() and time.monotonic() < end \
                    and not self._stop_evt.is_set():
                time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="neurofed.headsets")
    ap.add_argument("--subjects", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--runs", default="4,8,12")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--wait-consumers", type=float, default=60.0)
    ap.add_argument("--lead-in", type=float, default=1.0)
    ap.add_argument("--go-file", default=None, help="after the lead-in, also wait (<= --wait-consumers s) for this file")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        subjects = [int(s) for s in a.subjects.split(",") if s.strip()]
        runs = [int(r) for r in a.runs.split(",") if r.strip()]
        LeadInPlayer.lead_in = a.lead_in
        LeadInPlayer.go_file = Path(a.go_file) if a.go_file else None
        LeadInPlayer.go_timeout = a.wait_consumers
        players = []
        for i, s in enumerate(subjects):
            rec = load_eegmmidb(s, a.data_dir, runs, False)
            name = f"{a.name}-S{s:03d}" if len(subjects) > 1 else a.name
            cfg = PlayerConfig(name=name, speed=a.speed, wait_consumers=a.wait_consumers, seed=i)
            print(f"{name}: {rec.n_channels} ch @ {rec.sfreq:g} Hz, {rec.n_samples / rec.sfreq:.1f} s, "
                  f"{len(rec.markers)} markers, source_id {cfg.source_id}", flush=True)
            players.append(LeadInPlayer(rec, cfg))
        for p in players:
            p.start()
        run_to_end(players)
    except NeuroFedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
