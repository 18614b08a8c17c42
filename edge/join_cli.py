"""``edge-client join``: take part in a federation over MQTT with this host's own trials."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from neurofed.edge.store import store_loader, store_montage
from neurofed.trainer.data import load_eegmmidb_subject
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.data.profiles import get_profile, load_profile_subject
from neurofed.trainer.errors import DataError, NeuroFedError

if TYPE_CHECKING:  # the heavy imports (torch via safetensors, mne) wait until the broker has answered
    from neurofed.broker.protocol import ModelSpec
    from neurofed.trainer.data.dataset import SubjectData


def make_loader(data_dir: Path | None, subject: int | None, store: Path | None, profile: str | None = None,
                noise_seed: int = 0):
    """``ModelSpec -> SubjectData`` from EEGMMIDB files (``--data-dir/--subject``) or a captured store.

    In a federation of device profiles (``spec.profile`` set) an EEGMMIDB subject is recorded through
    ``profile`` (default ``lab64``, the recording as it is; :func:`neurofed.trainer.data.profiles.load_profile_subject`,
    as ``neurofed simulate --profiles`` does) and keeps all of that device's channels.
    """
    if (store is None) == (subject is None):
        raise DataError("give either --store DIR or --subject N (with --data-dir)")
    if profile is not None and store is not None:
        raise DataError("--profile presents an EEGMMIDB subject through a device; a --store is already a device's")

    def load(spec: ModelSpec) -> SubjectData:
        cfg = PreprocessConfig.from_dict(spec.preprocess)
        if spec.profile and store is None:
            return load_profile_subject(int(subject), profile or "lab64", cfg, data_dir, noise_seed)  # type: ignore[arg-type]
        if store is not None:
            return store_loader(store)(spec)

        return load_eegmmidb_subject(int(subject), cfg, data_dir)  # type: ignore[arg-type]

    return load


def make_montage(store: Path | None, profile: str | None):
    """``() -> (channels, rate)`` of this client's device: the store's, or the ``--profile`` an EEGMMIDB
    subject is presented through (default ``lab64``)."""

    if store is not None:
        return store_montage(store)

    def montage() -> tuple[list[str], float]:
        p = get_profile(profile or "lab64")
        return list(p.channels), p.sfreq

    return montage


def join(
    broker: Annotated[str, typer.Option(help="Broker URL, mqtt://host:port or mqtts://host:port.")],
    client_id: Annotated[str, typer.Option(help="This client's id in the federation ([A-Za-z0-9_.-], <= 64).")],
    federation: Annotated[str, typer.Option(help="Federation name.")] = "neurofed",
    data_dir: Annotated[Path | None, typer.Option(help="EEGMMIDB folder (with --subject).")] = None,
    subject: Annotated[int | None, typer.Option(help="EEGMMIDB subject number.")] = None,
    store: Annotated[Path | None, typer.Option(help="Captured on-device trial store.")] = None,
    state_dir: Annotated[Path, typer.Option(help="Where the client keeps its state between rounds.")] = Path(
        "~/.neurofed/edge"),
    join_timeout: Annotated[float, typer.Option(help="Seconds to wait for a running federation (the coordinator's model).")] = 120.0,
    wait_for_broker: Annotated[float, typer.Option(
        help="Seconds to keep retrying an unreachable broker (for devices that boot before it); 0 = fail at once.")] = 0.0,
    keepalive: Annotated[int, typer.Option(help="MQTT keepalive seconds (dropout detection ~1.5x).")] = 10,
    ca_certs: Annotated[Path | None, typer.Option(help="CA file for mqtts://.")] = None,
    max_seconds: Annotated[float | None, typer.Option(help="Leave after this many seconds.")] = None,
    profile: Annotated[str | None, typer.Option(
        help="With --subject: the device profile (shipped name or .json) the recording is presented through in a "
        "federation of device profiles (default lab64: the recording as it is).")] = None,
    noise_seed: Annotated[int, typer.Option(help="With --profile: seed of the profile's simulated noise.")] = 0,
    window: Annotated[int, typer.Option(
        help="Asynchronous federations: train on the newest N trials of the store (0: all); with --store the "
        "store is read again before each training (and each evaluation with --evaluate), so trials recorded "
        "meanwhile count.", min=0)] = 0,
    evaluate: Annotated[bool, typer.Option(
        help="Asynchronous federations with releases: validate instead of training - evaluate each candidate model "
        "(and the current release) on this host's trials and report balanced accuracy and counts, never trials.")
    ] = False,
) -> None:
    """Join a federation: train on local trials when selected, upload weights only (never EEG)."""
    if wait_for_broker <= 0:  # fail in about a second on a dead broker, before importing torch
        from neurofed.broker.transport import (  # lazy: paho-mqtt (keeps --help fast)
            NO_BROKER_HINT,
            BrokerURL,
            TransportError,
        )

        try:
            BrokerURL.parse(broker).probe()
        except TransportError as exc:
            raise TransportError(f"{exc}{NO_BROKER_HINT}") from None
    import torch

    from neurofed.edge.federation import EdgeClient  # lazy: paho-mqtt, torch (keeps --help fast)

    torch.set_num_threads(max(1, torch.get_num_threads()))
    loader = make_loader(data_dir, subject, store, profile, noise_seed)
    client = EdgeClient(broker, federation, client_id, loader, state_dir.expanduser(), join_timeout, wait_for_broker,
                        montage=make_montage(store, profile), window=window, reload_data=store is not None, evaluate=evaluate,
                        keepalive=keepalive, ca_certs=str(ca_certs) if ca_certs else None)
    try:
        n = client.run(max_seconds=max_seconds)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    typer.echo(f"{client_id}: trained {n} round(s); federation {'finished' if client.finished else 'left'}")
    if not client.finished and max_seconds is None:
        raise NeuroFedError("left before the federation finished")


def register(app: typer.Typer) -> None:
    """Add ``join`` to ``edge-client``."""
    app.command("join")(join)
