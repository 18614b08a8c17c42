"""The publisher's side of signed releases: a kept history of signed standalone models, published retained.

The publisher keeps every release it signed in a folder (``--store``, default ``releases/``): ``v0003.onnx`` and
``v0003.onnx.sig`` (the detached signature of :mod:`neurofed_runtime.release`). :func:`publish` signs a new model as
version ``latest + 1`` (parent: the latest) and publishes it **retained** on ``neurofed/<federation>/release``
(:attr:`neurofed.broker.protocol.Topics.release`), so a decoder that connects later still gets the current release.
:func:`rollback` republishes the bytes of an earlier kept release, signed anew as version ``latest + 1`` with
``rollback_of`` naming the version it restores: decoders only accept a version above the one they run, so a rollback
must carry a higher number (docs/security.md, "Signed releases").
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from neurofed_runtime import release as rel
from neurofed_runtime.model import StandaloneModel

from neurofed.broker.protocol import Topics
from neurofed.trainer.errors import NeuroFedError

logger = logging.getLogger("neurofed.broker")

_KEPT = re.compile(r"^v(\d{4,})\.onnx$")


class ReleaseStore:
    """The releases a publisher signed, one ``vNNNN.onnx`` + ``.sig`` pair each, in ``folder``."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def versions(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.folder.iterdir() if (m := _KEPT.match(p.name)))

    def latest(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def path(self, version: int) -> Path:
        return self.folder / f"v{version:04d}.onnx"

    def history(self) -> list[dict[str, Any]]:
        """The kept releases' signed headers, oldest first."""
        return [rel.read_sig(rel.sig_path(self.path(v)))["header"] for v in self.versions()]

    def add(self, data: bytes, doc: dict[str, Any]) -> Path:
        """Keep a signed release (files written whole, then renamed into place)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        p = self.path(doc["header"]["version"])
        for dst, blob in ((p, data), (rel.sig_path(p), json.dumps(doc, indent=1).encode())):
            tmp = dst.with_name(dst.name + ".tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, dst)
        return p


def check_standalone(path: str | os.PathLike) -> None:
    """A release must be a standalone graph whose metadata agrees with it (the runtime's checks, one line)."""
    StandaloneModel(path)


def sign_next(store: ReleaseStore, data: bytes, key_path: str | os.PathLike,
              rollback_of: int | None = None) -> tuple[Path, dict[str, Any]]:
    """Sign ``data`` as the store's next version (parent: its latest) and keep it."""
    latest = store.latest()
    doc = rel.sign(data, rel.load_private(key_path), (latest or 0) + 1, latest, rollback_of=rollback_of)
    return store.add(data, doc), doc


def send(broker: str, federation: str, data: bytes, doc: dict[str, Any], timeout: float = 10.0,
         ca_certs: str | None = None) -> str:
    """Publish one signed release retained on the federation's release topic; the topic."""
    from neurofed.broker.transport import MqttTransport  # lazy: paho (signing and keys work without a broker)

    topic = Topics(federation).release
    payload = rel.pack(data, doc)
    if len(payload) > rel.DEFAULT_MAX_RELEASE_BYTES:
        raise NeuroFedError(f"release of {len(payload)} bytes exceeds the decoders' limit of "
                            f"{rel.DEFAULT_MAX_RELEASE_BYTES} bytes")
    with MqttTransport(broker, f"neurofed-release-{os.getpid()}", ca_certs=ca_certs).connect(timeout) as t:
        if not t.publish(topic, payload, retain=True, wait=timeout):
            raise NeuroFedError(f"{topic}: the broker did not acknowledge the release within {timeout:g} s")
    logger.info("published release %d (%d bytes) retained on %s", doc["header"]["version"], len(payload), topic)
    return topic


def publish(model: str | os.PathLike, key_path: str | os.PathLike, broker: str, federation: str,
            store: str | os.PathLike = "releases", ca_certs: str | None = None) -> dict[str, Any]:
    """Check, sign (next version), keep and publish a standalone model; its signed header."""
    check_standalone(model)
    st = ReleaseStore(store)
    path, doc = sign_next(st, Path(model).read_bytes(), key_path)
    send(broker, federation, path.read_bytes(), doc, ca_certs=ca_certs)
    return doc["header"]


def rollback(version: int, key_path: str | os.PathLike, broker: str, federation: str,
             store: str | os.PathLike = "releases", ca_certs: str | None = None) -> dict[str, Any]:
    """Republish kept release ``version`` as the current one: same bytes, signed anew as ``latest + 1``."""
    st = ReleaseStore(store)
    if version not in st.versions():
        raise NeuroFedError(f"release {version} is not kept in {st.folder} (kept: {st.versions() or 'none'})")
    data = rel.verify_file(st.path(version), _pub_of(key_path)).data  # a kept file altered since is refused
    path, doc = sign_next(st, data, key_path, rollback_of=version)
    send(broker, federation, path.read_bytes(), doc, ca_certs=ca_certs)
    return doc["header"]


def _pub_of(key_path: str | os.PathLike) -> Path:
    """The public key file beside a private key written by ``neurofed release keygen``."""
    p = Path(key_path).with_suffix(".pub")
    if not p.is_file():
        raise NeuroFedError(f"{p}: the public key beside {key_path} is missing (needed to check kept releases)")
    return p
