"""Signed releases in the runtime (neurofed_runtime.release): keys, detached signatures, refusals, the envelope."""

from __future__ import annotations

import json
import stat

import pytest
from neurofed_runtime import release as rel
from neurofed_runtime.errors import ModelError
from typer.testing import CliRunner

DATA = b"\x08\x07onnx-bytes-stand-in" * 100


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    priv, pub = rel.keygen(d)
    other = rel.keygen(d, name="other")
    return priv, pub, other[0], other[1]


def _signed(keys, version=2, parent=1, data=DATA, **kw):
    return rel.sign(data, rel.load_private(keys[0]), version, parent, model_hash="abc", **kw)


def test_keygen_private_key_is_owner_only_and_not_overwritten(keys, tmp_path):
    priv, pub = keys[0], keys[1]
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in priv.read_bytes() and b"PUBLIC KEY" in pub.read_bytes()
    with pytest.raises(ModelError, match="already there"):
        rel.keygen(priv.parent)
    with pytest.raises(ModelError, match="not an Ed25519 public key|not a readable public key"):
        rel.load_public(priv)


def test_sign_verify_roundtrip_and_header(keys):
    doc = _signed(keys, created="2026-11-29T10:00:00Z")
    h = doc["header"]
    assert h == {"format": rel.FORMAT, "version": 2, "parent": 1, "created": "2026-11-29T10:00:00Z",
                 "sha256": __import__("hashlib").sha256(DATA).hexdigest(), "size": len(DATA), "model_hash": "abc"}
    r = rel.verify(DATA, json.loads(json.dumps(doc)), rel.load_public(keys[1]))
    assert (r.version, r.parent, r.data, r.model_hash) == (2, 1, DATA, "abc")


@pytest.mark.parametrize("case", ["wrong_key", "tampered_bytes", "header_altered", "bad_base64", "extra_field",
                                  "truncated"])
def test_refusals_are_one_line(keys, case):
    doc = _signed(keys)
    data, pub = DATA, rel.load_public(keys[1])
    if case == "wrong_key":
        doc = rel.sign(DATA, rel.load_private(keys[2]), 2, 1, model_hash="abc")  # valid format, foreign key
    elif case == "tampered_bytes":
        data = DATA[:10] + b"X" + DATA[11:]
    elif case == "header_altered":
        doc["header"]["version"] = 99  # a higher version claimed without the key
    elif case == "bad_base64":
        doc["signature"] = "!!!"
    elif case == "extra_field":
        doc["header"]["pickle"] = "no"
    elif case == "truncated":
        data = DATA[:-1]
    with pytest.raises(ModelError) as e:
        rel.verify(data, doc, pub, "m.onnx")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("m.onnx:")
    want = {"wrong_key": "bad signature", "tampered_bytes": "sha256 mismatch", "header_altered": "bad signature",
            "bad_base64": "not base64", "extra_field": "not neurofed-release/1", "truncated": "sha256 mismatch"}
    assert want[case] in msg


def test_version_rule_refuses_older_or_equal(keys):
    r = rel.verify(DATA, _signed(keys, version=3, parent=2), rel.load_public(keys[1]))
    rel.check_newer(r, None)
    rel.check_newer(r, 2)
    for current in (3, 4):
        with pytest.raises(ModelError, match=f"version 3 is not newer than the running version {current}"):
            rel.check_newer(r, current)
    with pytest.raises(ModelError, match="must be below"):
        _signed(keys, version=2, parent=2)
    with pytest.raises(ModelError, match=">= 1"):
        _signed(keys, version=0, parent=None)


def test_envelope_roundtrip_and_bounds(keys):
    doc = _signed(keys)
    payload = rel.pack(DATA, doc)
    data, got = rel.unpack(payload)
    assert data == DATA and got == doc
    with pytest.raises(ModelError, match="exceeds the limit of 100"):
        rel.unpack(payload, max_bytes=100)  # refused before parsing
    with pytest.raises(ModelError, match="bad magic"):
        rel.unpack(b"NF\x03\x00" + payload[4:])
    with pytest.raises(ModelError, match="does not fit"):
        rel.unpack(rel.ENVELOPE_MAGIC + (10**6).to_bytes(4, "big") + b"{}")
    with pytest.raises(ModelError, match="not JSON"):
        rel.unpack(rel.ENVELOPE_MAGIC + (3).to_bytes(4, "big") + b"{x}")


def test_cli_keygen_sign_verify_and_refusals(standalone_model, tmp_path):
    """``neurofed release keygen/sign/verify`` on a real standalone export; a forged or missing signature is one
    ModelError line (exit 2 through run_cli)."""
    from neurofed.cli import app

    r = CliRunner()
    assert r.invoke(app, ["release", "keygen", "--out", str(tmp_path / "k")]).exit_code == 0
    assert r.invoke(app, ["release", "keygen", "--out", str(tmp_path / "x")]).exit_code == 0
    m = tmp_path / "m.onnx"
    m.write_bytes(standalone_model.read_bytes())
    res = r.invoke(app, ["release", "verify", str(m), "--pub", str(tmp_path / "k" / "release.pub")])
    # (run_cli turns a NeuroFedError into "error: <line>" and exit 2; CliRunner shows the exception itself)
    assert isinstance(res.exception, ModelError) and "signature file not found" in str(res.exception)
    res = r.invoke(app, ["release", "sign", str(m), "--key", str(tmp_path / "k" / "release.key"), "--version", "4",
                         "--parent", "3"])
    assert res.exit_code == 0, res.output
    sig = json.loads((tmp_path / "m.onnx.sig").read_text())
    from neurofed_runtime.model import StandaloneModel

    assert sig["header"]["version"] == 4 and sig["header"]["model_hash"] == StandaloneModel(m).card.model_hash
    res = r.invoke(app, ["release", "verify", str(m), "--pub", str(tmp_path / "k" / "release.pub")])
    assert res.exit_code == 0 and "OK" in res.output and "release 4" in res.output
    res = r.invoke(app, ["release", "verify", str(m), "--pub", str(tmp_path / "x" / "release.pub")])
    assert isinstance(res.exception, ModelError) and "bad signature" in str(res.exception)
    assert "\n" not in str(res.exception)
