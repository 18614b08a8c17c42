"""``headset-sim``: replay recordings (or EEGMMIDB subjects) as live LSL headsets."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated

import typer

from neurofed.firmware_sim.player import PlayerConfig, play_many, run_to_end
from neurofed.firmware_sim.recording import (
    LSL_UNITS,
    Recording,
    load_eegmmidb,
    load_recording,
    through_profile,
)
from neurofed.trainer.data.profiles import get_profile
from neurofed.trainer.errors import NeuroFedError, run_cli

app = typer.Typer(name="headset-sim", help="Simulated EEG headsets: replay recordings as LSL EEG + marker streams.",
                  add_completion=False, pretty_exceptions_enable=False)


def _parse_outage(text: str) -> tuple[float, float]:
    try:
        at, dur = (float(v) for v in text.split(":"))
    except ValueError:
        raise NeuroFedError(f"--outage expects START:DURATION in stream seconds (e.g. 30:5), got {text!r}") from None
    return at, dur


def _parse_ints(text: str, what: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise NeuroFedError(f"{what} expects a comma list of integers, got {text!r}") from None


@app.command()
def play(
    files: Annotated[list[Path] | None, typer.Argument(help="Recordings (EDF or any MNE-readable file).")] = None,
    subject: Annotated[int | None, typer.Option(help="EEGMMIDB subject (runs concatenated, per-run labels).")] = None,
    subjects: Annotated[str | None, typer.Option(help="Several EEGMMIDB subjects, e.g. 1,2,3 (one headset each).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="EEGMMIDB folder (default $NEUROFED_DATA or ../shared/data).")] = None,
    runs: Annotated[str, typer.Option(help="EEGMMIDB runs to concatenate.")] = "4,8,12",
    name: Annotated[str, typer.Option(help="Stream name (prefix when several headsets: NAME-S001...).")] = "neurofed-sim",
    speed: Annotated[float, typer.Option(help="Playback speed (1 = real time).")] = 1.0,
    loop: Annotated[bool, typer.Option("--loop", help="Restart at the end.")] = False,
    chunk_size: Annotated[int, typer.Option(help="Samples per push.")] = 16,
    clock_offset: Annotated[float, typer.Option(help="Seconds added to every timestamp.")] = 0.0,
    jitter: Annotated[float, typer.Option(help="Timestamp jitter std (s) per chunk.")] = 0.0,
    drop_prob: Annotated[float, typer.Option(help="Probability a chunk is lost.")] = 0.0,
    outage: Annotated[list[str] | None, typer.Option(help="START:DURATION (stream s) of a simulated disconnect; repeatable.")] = None,
    counter: Annotated[bool, typer.Option("--counter", help="Add a 'Samples' channel with the sample index.")] = False,
    include_rest: Annotated[bool, typer.Option("--include-rest", help="Also send T0 as 'rest' markers.")] = False,
    duration: Annotated[float | None, typer.Option(help="Stop after this many wall-clock seconds.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of jitter and drops.")] = 0,
    wait_consumers: Annotated[float, typer.Option(help="Seconds to wait for an inlet on each stream before streaming (0 = don't).")] = 0.0,
    lead_in: Annotated[float, typer.Option(help="Seconds to wait after the inlets attached, before the first sample.")] = 0.0,
    go_file: Annotated[Path | None, typer.Option(help="Then also wait (bounded by --wait-consumers) until this file exists.")] = None,
    profile: Annotated[str | None, typer.Option(help="Device profile (trainer/data/profiles/NAME.json or a .json path): stream that headset's channels, rate and unit.")] = None,
) -> None:
    """Stream until the recordings end (or --duration, or Ctrl-C)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    recs: list[tuple[str, Recording]] = []
    ids = ([subject] if subject is not None else []) + (_parse_ints(subjects, "--subjects") if subjects else [])
    run_list = _parse_ints(runs, "--runs")
    for s in ids:
        recs.append((f"S{s:03d}", load_eegmmidb(s, data_dir, run_list, include_rest)))
    for f in files or []:
        recs.append((f.stem, load_recording(f, None, include_rest)))
    if not recs:
        raise NeuroFedError("nothing to play: give recording files, --subject or --subjects")
    unit = "microvolts"
    if profile is not None:
        prof = get_profile(profile)
        recs = [(tag, through_profile(rec, prof, seed + i)) for i, (tag, rec) in enumerate(recs)]
        unit = LSL_UNITS[prof.unit]
    outages = tuple(_parse_outage(o) for o in outage or [])
    items = []
    for i, (tag, rec) in enumerate(recs):
        stream = name if len(recs) == 1 else f"{name}-{tag}"
        cfg = PlayerConfig(name=stream, chunk_size=chunk_size, speed=speed, loop=loop, clock_offset=clock_offset,
                           jitter=jitter, drop_prob=drop_prob, outages=outages, counter=counter, seed=seed + i,
                           wait_consumers=wait_consumers, lead_in=lead_in, unit=unit,
                           go_file=None if go_file is None else str(go_file))
        items.append((rec, cfg))
        print(f"{stream}: {rec.n_channels} ch @ {rec.sfreq:g} Hz, {rec.n_samples / rec.sfreq:.1f} s, "
              f"{len(rec.markers)} markers, source_id {cfg.source_id}")
    players = play_many(items)
    run_to_end(players, None if duration is None else time.monotonic() + duration)

def main() -> None:
    """Entry point: NeuroFed's own errors print one clear line and exit 2."""

    run_cli(app)


if __name__ == "__main__":
    main()
