"""``edge-client record``: capture cued trials from an LSL headset into the on-device store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from neurofed.edge.capture import CaptureConfig, LiveCapture
from neurofed.edge.store import LocalStore
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.errors import NeuroFedError


def register(app: typer.Typer) -> None:
    """Add the ``record`` command to the ``edge-client`` app."""

    @app.command()
    def record(
        stream: Annotated[str | None, typer.Option(help="EEG stream name.")] = None,
        store: Annotated[Path, typer.Option(help="Store folder (created; appended to if it exists).")] = Path("trials"),
        source_id: Annotated[str | None, typer.Option(help="EEG stream source_id (instead of / with --stream).")] = None,
        marker_stream: Annotated[str | None, typer.Option(help="Marker stream name (default STREAM-markers).")] = None,
        max_trials: Annotated[int | None, typer.Option(help="Stop after this many trials.")] = None,
        duration: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
        idle_timeout: Annotated[float | None, typer.Option(help="Stop after this many seconds without EEG.")] = None,
        classes: Annotated[str, typer.Option(help="Cue markers that start a trial.")] = "left_fist,right_fist",
        channels: Annotated[str | None, typer.Option(help="Channels to keep, in order (default: all EEG).")] = None,
        tmin: Annotated[float, typer.Option(help="Window start after the cue (s).")] = 0.0,
        tmax: Annotated[float, typer.Option(help="Window end after the cue (s).")] = 4.0,
        sfreq: Annotated[float | None, typer.Option(help="Refuse a stream with another rate (Hz).")] = None,
        subject: Annotated[str, typer.Option(help="Subject id stored with the trials.")] = "local",
        processing: Annotated[str, typer.Option(help="Inlet processing: none, clocksync, dejitter, all.")] = "clocksync",
        resolve_timeout: Annotated[float, typer.Option(help="Seconds to find the streams.")] = 10.0,
    ) -> None:
        """Capture trials at cue markers and append them (raw, checksummed, in microvolts) to the store.

        A stream in raw ``counts`` (e.g. headset-sim --profile cyton_daisy16) is converted with the gain of the
        device profile its channels and rate match; one matching none is refused.
        """
        from rich.console import Console

        if stream is None and source_id is None:
            raise NeuroFedError("give --stream NAME or --source-id ID of the EEG stream")
        console = Console(soft_wrap=True)
        cls = tuple(c.strip() for c in classes.split(",") if c.strip())
        chans = tuple(c.strip() for c in channels.split(",") if c.strip()) if channels else None
        cfg = CaptureConfig(preprocess=PreprocessConfig(tmin=tmin, tmax=tmax), classes=cls, channels=chans,
                            expected_sfreq=sfreq)
        st = LocalStore(store, subject=subject, classes=cls)
        before = len(st)
        cap = LiveCapture(name=stream, source_id=source_id, marker_name=marker_stream, cfg=cfg,
                          resolve_timeout=resolve_timeout, processing=processing)
        console.print(f"recording {cap.eeg.meta.name} ({cap.eeg.meta.n_channels} ch @ {cap.eeg.meta.sfreq:g} Hz) "
                      f"into {store} ({before} trials already there)")
        if (prof := cap.cutter.profile) is not None:
            console.print(f"raw counts: stream matches device profile {prof.name} ({prof.gain:g} counts per µV); "
                          "trials are stored in microvolts")

        def on_trial(tr) -> None:
            seq = st.append(tr)
            console.print(f"trial {seq}: {tr.label} ({len(st)} in store)")

        try:
            stats = cap.run(on_trial, max_trials=max_trials, duration=duration, idle_timeout=idle_timeout)
        except KeyboardInterrupt:
            stats = cap.stats
        finally:
            cap.close()
        console.print(f"captured {stats.trials} trials ({stats.samples} samples, {len(stats.skipped)} skipped, "
                      f"{stats.outages} outages); store holds {len(st)}")
