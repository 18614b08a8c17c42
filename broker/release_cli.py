"""``neurofed release``: keys, detached signatures, publishing and rolling back signed releases (typer adapter).

The work is in :mod:`neurofed_runtime.release` (keys, signatures, the envelope, the version rule) and
:mod:`neurofed.broker.releases` (the publisher's kept history, the retained publish).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from neurofed.trainer.errors import NeuroFedError

release_app = typer.Typer(help="Signed model releases: Ed25519 keys, sign/verify, publish retained, roll back.",
                          no_args_is_help=True)

Store = Annotated[Path, typer.Option(help="folder where the publisher keeps every release it signed")]
Broker = Annotated[str, typer.Option(help="broker URL (mqtt://host:port or mqtts://...)")]
Federation = Annotated[str, typer.Option(help="federation name (topic neurofed/<name>/release)")]
Key = Annotated[Path, typer.Option(help="private key file (neurofed release keygen)")]
Ca = Annotated[Path | None, typer.Option(help="CA certificate for mqtts://")]


@release_app.command("keygen")
def keygen_cmd(out: Annotated[Path, typer.Option(help="folder for release.key (mode 600) and release.pub")]) -> None:
    """Generate the federation's Ed25519 release key pair."""
    from neurofed_runtime.release import keygen

    priv, pub = keygen(out)
    print(f"private key {priv} (mode 600: keep it on the publisher only); public key {pub} (give it to decoders)")


@release_app.command("sign")
def sign_cmd(
    model: Annotated[Path, typer.Argument(help="standalone .onnx model")],
    key: Key,
    version: Annotated[int, typer.Option(help="release version (>= 1)")] = 1,
    parent: Annotated[int | None, typer.Option(help="the release it follows")] = None,
) -> None:
    """Write MODEL.onnx.sig: a detached Ed25519 signature over the file's SHA-256 and a small JSON header."""
    from neurofed_runtime import release as rel

    try:
        data = model.read_bytes()
    except OSError:
        raise NeuroFedError(f"{model}: model file not found") from None
    doc = rel.sign(data, rel.load_private(key), version, parent)
    rel.sig_path(model).write_text(json.dumps(doc, indent=1))
    print(f"signed {model} as release {version} -> {rel.sig_path(model)}")


@release_app.command("verify")
def verify_cmd(
    model: Annotated[Path, typer.Argument(help=".onnx model with MODEL.onnx.sig beside it")],
    pub: Annotated[Path, typer.Option(help="the federation's public release key")],
    sig: Annotated[Path | None, typer.Option(help="signature file (default MODEL.onnx.sig)")] = None,
) -> None:
    """Verify a model against its detached signature (exit 2 with one line if it does not verify)."""
    from neurofed_runtime.release import verify_file

    r = verify_file(model, pub, sig)
    print(f"OK: {model} is release {r.version} (parent {r.parent}, created {r.created}, sha256 {r.sha256[:16]}...)")


@release_app.command("publish")
def publish_cmd(model: Annotated[Path, typer.Argument(help="standalone .onnx model")], key: Key,
                broker: Broker, federation: Federation, store: Store = Path("releases"), ca: Ca = None) -> None:
    """Sign MODEL as the next release, keep it in --store and publish it retained on the release topic."""
    from neurofed.broker.releases import publish  # lazy: torch (broker.protocol); keeps --help fast

    h = publish(model, key, broker, federation, store, str(ca) if ca else None)
    print(f"published release {h['version']} (parent {h['parent']}, sha256 {h['sha256'][:16]}...) "
          f"on neurofed/{federation}/release")


@release_app.command("rollback")
def rollback_cmd(version: Annotated[int, typer.Option(help="kept release to make current again")], key: Key,
                 broker: Broker, federation: Federation, store: Store = Path("releases"), ca: Ca = None) -> None:
    """Republish an earlier kept release as current, signed anew with the next (higher) version number."""
    from neurofed.broker.releases import rollback  # lazy: torch (broker.protocol); keeps --help fast

    h = rollback(version, key, broker, federation, store, str(ca) if ca else None)
    print(f"rolled back to release {version}'s model: published as release {h['version']} (parent {h['parent']})")


@release_app.command("list")
def list_cmd(store: Store = Path("releases"),
             candidates: Annotated[bool, typer.Option(help="also the candidates the release gate refused")] = False
             ) -> None:
    """The releases kept in --store (version, parent, rollback_of, created, sha256) and, for a coordinator's
    release folder, the release history: model version, parent, federated validation (clients, mean BCA, paired
    difference to the parent release, per-client trial counts)."""
    from neurofed.broker.release_gate import read_history  # lazy: torch (broker.protocol); keeps --help fast
    from neurofed.broker.releases import ReleaseStore  # lazy: as above

    signed = {h["version"]: h for h in ReleaseStore(store).history()}
    gate = read_history(store)
    for h in signed.values():
        if any(r.get("release") == h["version"] for r in gate):
            continue  # printed with its validation below
        back = f" (rollback of {h['rollback_of']})" if h.get("rollback_of") else ""
        print(f"{h['version']:>4}  parent {h['parent']}  {h['created']}  {h['sha256'][:16]}...{back}")
    for r in gate:
        if not r.get("released") and not candidates:
            continue
        d = r.get("paired_diff_mean")
        fig = (f"{r['n_clients']} clients, {r['n_trials']} trials, BCA {r['bca_mean']:.4f}" if r.get("bca_mean")
               is not None else f"{r['n_clients']} clients")
        if d is not None:
            fig += f", vs release {r['parent']} {d:+.4f}"
        if r.get("paired_diff_se") is not None:
            fig += f" (se {r['paired_diff_se']:.4f})"
        head = f"{r['release']:>4}" if r.get("released") else "   -"
        sig = signed.get(r.get("release") or -1)
        tail = f"  signed {sig['sha256'][:16]}..." if sig else ""
        print(f"{head}  version {r['version']}  parent {r['parent']}  {r['decided_at']}  {fig}{tail}"
              + ("" if r.get("released") else f"  refused: {r['reason']}"))


@release_app.command("report")
def report_cmd(
    predictions: Annotated[list[str], typer.Option(help="NAME=FILE: a decoder's --predictions-out file (repeat it "
                                                        "for each decoder)")],
    store: Store = Path("releases"),
    out: Annotated[Path | None, typer.Option(help="write the report here (JSON)")] = None,
) -> None:
    """Each release's live BCA (the cue-locked windows it decoded, from `edge-client infer --follow --mode cue
    --predictions-out`, against their cues) beside its federated validation BCA (the release gate's history)."""
    from neurofed.release_report import release_report, summary_lines  # lazy: scipy, torch (release gate)

    files: dict[str, Path] = {}
    for item in predictions:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise NeuroFedError(f"--predictions {item!r}: use NAME=FILE")
        files[name] = Path(path)
    rep = release_report(files, store)
    for line in summary_lines(rep):
        print(line)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rep, indent=1))
        print(f"wrote {out}")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add ``neurofed release``."""
    app.add_typer(release_app, name="release")
