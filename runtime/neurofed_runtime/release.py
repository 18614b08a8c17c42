"""Signed model releases: Ed25519 keys, detached signatures, the release envelope, the version rule.

A **release** is a standalone ONNX file (``neurofed export --standalone``) and a detached signature
(``MODEL.onnx.sig``, JSON, no pickle)::

    {"header": {"format": "neurofed-release/1", "version": 3, "parent": 2, "created": "2026-11-29T10:00:00Z",
                "sha256": "<hex of the exact file bytes>", "size": 123456, "model_hash": "<card's model_hash>"},
     "signature": "<base64 Ed25519 signature of SIGNED_PREFIX + canonical JSON of header>"}

The canonical JSON is ``json.dumps(header, sort_keys=True, separators=(",", ":"))``. On MQTT a release travels as one
**envelope** (:func:`pack` / :func:`unpack`): ``b"NFR" | 1 (format byte) | uint32 big-endian length of the signature
JSON | signature JSON | ONNX bytes``; :func:`unpack` refuses a payload above its ``max_bytes`` before parsing.

**Version rule** (:func:`check_newer`): a decoder runs a release only if its version is strictly higher than the one
it runs; a rollback is therefore an earlier model signed anew with a higher version (its ``parent`` naming the
release it replaces, its ``rollback_of`` the version whose bytes it republishes).

Needs the ``cryptography`` library (``pip install neurofed-runtime[signed]``); without it every function here
raises :class:`~neurofed_runtime.errors.ModelError` in one line.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neurofed_runtime.errors import ModelError

FORMAT = "neurofed-release/1"
#: bytes signed = this prefix + the canonical header JSON (a signature of anything else never verifies as a release)
SIGNED_PREFIX = b"neurofed-release/1\n"
ENVELOPE_MAGIC = b"NFR\x01"
_LEN = struct.Struct(">I")
#: the signature JSON is small (a header and 88 base64 characters); anything larger is not a release
MAX_SIG_BYTES = 16 << 10
#: default cap of a whole envelope (signature + ONNX); a standalone EEGNet graph (21 channels) is about 1.2 MB
DEFAULT_MAX_RELEASE_BYTES = 32 << 20
_HEADER_KEYS = {"format", "version", "parent", "created", "sha256", "size", "model_hash", "rollback_of"}


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    except ImportError:  # pragma: no cover - the [signed] extra not installed
        raise ModelError("signed releases need the cryptography library: pip install 'neurofed-runtime[signed]'"
                         ) from None
    return InvalidSignature, serialization, Ed25519PrivateKey, Ed25519PublicKey


@dataclass(frozen=True)
class Release:
    """A verified release: its header fields and the ONNX bytes they sign."""

    version: int
    parent: int | None
    created: str
    sha256: str
    model_hash: str
    data: bytes
    header: dict[str, Any]
    rollback_of: int | None = None


# ----------------------------------------------------------------------------- keys
def keygen(out_dir: str | os.PathLike, name: str = "release") -> tuple[Path, Path]:
    """Write a new Ed25519 key pair: ``<name>.key`` (PKCS#8 PEM, mode 600) and ``<name>.pub`` (PEM)."""
    _, ser, Priv, _ = _crypto()
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    priv_path, pub_path = d / f"{name}.key", d / f"{name}.pub"
    if priv_path.exists():
        raise ModelError(f"{priv_path}: a private key is already there; refusing to overwrite it")
    key = Priv.generate()
    pem = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(priv_path, 0o600)
    pub_path.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    return priv_path, pub_path


def load_private(path: str | os.PathLike):
    """The Ed25519 private key of a PEM file written by :func:`keygen`."""
    _, ser, Priv, _ = _crypto()
    try:
        key = ser.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(f"{path}: not a readable private key ({type(exc).__name__})") from None
    if not isinstance(key, Priv):
        raise ModelError(f"{path}: not an Ed25519 private key")
    return key


def load_public(path: str | os.PathLike):
    """The Ed25519 public key of a PEM file written by :func:`keygen`."""
    _, ser, _, Pub = _crypto()
    try:
        key = ser.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(f"{path}: not a readable public key ({type(exc).__name__})") from None
    if not isinstance(key, Pub):
        raise ModelError(f"{path}: not an Ed25519 public key")
    return key


# ----------------------------------------------------------------------------- sign / verify
def canonical(header: dict[str, Any]) -> bytes:
    """The exact bytes a release signature covers."""
    return SIGNED_PREFIX + json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def model_hash_of(data: bytes) -> str:
    """The card's ``model_hash`` of ONNX bytes ("" when the file carries none), read by onnxruntime."""
    from neurofed_runtime.card import META_KEY, parse_card  # lazy: onnxruntime
    from neurofed_runtime.model import make_session

    sess = make_session(data, source="release")
    card = parse_card(sess.get_modelmeta().custom_metadata_map.get(META_KEY), "release")
    return str(getattr(card, "model_hash", "") or "")


def sign(data: bytes, key, version: int, parent: int | None = None, created: str | None = None,
         rollback_of: int | None = None, model_hash: str | None = None) -> dict[str, Any]:
    """The signature document (header + base64 signature) of the ONNX bytes ``data`` as release ``version``."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ModelError(f"release version {version!r} must be an integer >= 1")
    if parent is not None and (not isinstance(parent, int) or parent < 0 or parent >= version):
        raise ModelError(f"parent version {parent!r} must be below the release's version {version}")
    header: dict[str, Any] = {
        "format": FORMAT, "version": version, "parent": parent,
        "created": created or _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
        "model_hash": model_hash if model_hash is not None else model_hash_of(data),
    }
    if rollback_of is not None:
        header["rollback_of"] = int(rollback_of)
    sig = key.sign(canonical(header))
    return {"header": header, "signature": base64.b64encode(sig).decode()}


def _header(doc: Any, source: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or set(doc) != {"header", "signature"}:
        raise ModelError(f"{source}: signature document must hold exactly 'header' and 'signature'")
    h = doc["header"]
    if not isinstance(h, dict) or not set(h) <= _HEADER_KEYS or h.get("format") != FORMAT:
        raise ModelError(f"{source}: release header is not {FORMAT} (fields {sorted(h) if isinstance(h, dict) else h})")
    v, p = h.get("version"), h.get("parent")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1 or (p is not None and not isinstance(p, int)):
        raise ModelError(f"{source}: release header has an invalid version/parent ({v!r}, {p!r})")
    if not isinstance(h.get("sha256"), str) or not isinstance(h.get("size"), int):
        raise ModelError(f"{source}: release header lacks the model's sha256/size")
    return h


def verify(data: bytes, doc: dict[str, Any], pub, source: str = "release") -> Release:
    """Check a signature document against the ONNX bytes and the public key: the verified :class:`Release`, or a
    one-line :class:`ModelError` (bad or foreign signature, bytes that are not the signed ones)."""
    Invalid, _, _, _ = _crypto()
    h = _header(doc, source)
    try:
        sig = base64.b64decode(doc["signature"], validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ModelError(f"{source}: signature is not base64") from None
    try:
        pub.verify(sig, canonical(h))
    except Invalid:
        raise ModelError(f"{source}: bad signature (not signed by the federation's release key, or header altered)"
                         ) from None
    if len(data) != h["size"] or hashlib.sha256(data).hexdigest() != h["sha256"]:
        raise ModelError(f"{source}: model bytes differ from the signed ones (sha256 mismatch: tampered or truncated)")
    return Release(h["version"], h.get("parent"), str(h.get("created", "")), h["sha256"], str(h.get("model_hash", "")),
                   bytes(data), dict(h), h.get("rollback_of"))


def check_newer(release: Release, current: int | None, source: str = "release") -> None:
    """The version rule: refuse a release whose version is not strictly above the running one."""
    if current is not None and release.version <= current:
        raise ModelError(f"{source}: version {release.version} is not newer than the running version {current}; "
                         "kept the current model")


def sig_path(model: str | os.PathLike) -> Path:
    """``MODEL.onnx`` -> ``MODEL.onnx.sig``."""
    return Path(f"{model}.sig")


def read_sig(path: str | os.PathLike) -> dict[str, Any]:
    """A signature document from a ``.sig`` file (JSON; one-line errors)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError:
        raise ModelError(f"{p}: signature file not found (an unsigned model is refused)") from None
    if len(raw) > MAX_SIG_BYTES:
        raise ModelError(f"{p}: signature file of {len(raw)} bytes is too large to be a release signature")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelError(f"{p}: signature file is not JSON") from None


def verify_file(model: str | os.PathLike, pub_path: str | os.PathLike, sig: str | os.PathLike | None = None
                ) -> Release:
    """Verify ``MODEL.onnx`` against ``MODEL.onnx.sig`` (or ``sig``) and the public key file."""
    try:
        data = Path(model).read_bytes()
    except OSError:
        raise ModelError(f"{model}: model file not found") from None
    return verify(data, read_sig(sig or sig_path(model)), load_public(pub_path), str(model))


# ----------------------------------------------------------------------------- envelope
def pack(data: bytes, doc: dict[str, Any]) -> bytes:
    """The MQTT payload of a release: magic, signature JSON length, signature JSON, ONNX bytes."""
    sig = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return ENVELOPE_MAGIC + _LEN.pack(len(sig)) + sig + bytes(data)


def unpack(payload: bytes, max_bytes: int = DEFAULT_MAX_RELEASE_BYTES) -> tuple[bytes, dict[str, Any]]:
    """``(onnx bytes, signature document)`` of an envelope, refusing oversized or malformed payloads in one line
    (nothing is verified here: pass the result to :func:`verify`)."""
    n = len(payload)
    if n > max_bytes:
        raise ModelError(f"release payload of {n} bytes exceeds the limit of {max_bytes}")
    head = len(ENVELOPE_MAGIC) + _LEN.size
    if n < head or bytes(payload[:len(ENVELOPE_MAGIC)]) != ENVELOPE_MAGIC:
        raise ModelError("release payload is not a NeuroFed release envelope (bad magic)")
    (slen,) = _LEN.unpack_from(payload, len(ENVELOPE_MAGIC))
    if slen > MAX_SIG_BYTES or head + slen > n:
        raise ModelError(f"release payload declares a {slen}-byte signature that does not fit")
    try:
        doc = json.loads(bytes(payload[head:head + slen]))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelError("release payload's signature is not JSON") from None
    return bytes(payload[head + slen:]), doc
