"""A study's raw per-job results as ONE compressed JSON-lines file: ``studies/<name>/raw.jsonl.gz``.

A results tree (what ``neurofed grid``/``simulate``/``classical``/``ensemble``/``sweep`` write: ``<group>/<run>/``
with ``config.json``, ``results.json``, ``jobs/seedS_foldKK.json``, ``sweep/...``, ``onnx_attack/...``) is stored
as one gzip file holding one line per JSON file, in path order::

    {"path": "table46/safe/jobs/seed0_fold00.json", "json": {...the file's content...}}

Paths are relative to the results root and start with the grid's group, so several studies' files unpacked into
one root sit where the grids wrote them. JSON round-trips Python floats exactly, so a job read back compares
equal to the job written (what ``neurofed grid --reproduce`` checks). The gzip header carries no time stamp:
packing the same tree twice gives the same bytes. Training logs are not kept (each run's ``results.json`` holds
its held-out BCA per evaluated round, each job its wall time).

``neurofed report`` and ``neurofed grid`` read these files directly (:func:`run_results`, :func:`unpack`).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from neurofed.trainer.errors import NeuroFedError

#: The raw file's name inside a study folder.
RAW_NAME = "raw.jsonl.gz"
#: Where studies live in a checkout, and where their raw files are unpacked for grids and scripts.
STUDIES = Path("studies")
WORK = Path("runs/studies")


def is_raw(p: Path | str) -> bool:
    """True for a ``.jsonl.gz`` path, or a study folder holding :data:`RAW_NAME`."""
    s = str(p)
    return s.endswith(".jsonl.gz") or (Path(s).is_dir() and (Path(s) / RAW_NAME).is_file())


def split_ref(ref: Path | str) -> tuple[Path, str]:
    """``studies/x/raw.jsonl.gz:table46/ct`` -> (raw file, ``table46/ct``); a study folder -> its raw file, ``""``."""
    s = str(ref)
    raw, sep, inner = s.partition(".jsonl.gz:")
    path = Path(raw + ".jsonl.gz") if sep else Path(s)
    if path.is_dir():
        path = path / RAW_NAME
    return path, inner.strip("/")


def iter_entries(raw: Path) -> Iterator[tuple[str, Any]]:
    """(path, parsed JSON) of every line of ``raw``.

    Raises
    ------
    NeuroFedError
        A missing, truncated or corrupt file, naming it (and the line).
    """
    if not raw.is_file():
        raise NeuroFedError(f"{raw}: raw results file not found")
    n = 0
    try:
        with gzip.open(raw, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                try:
                    entry = json.loads(line)
                    path, obj = entry["path"], entry["json"]
                except (ValueError, KeyError, TypeError) as exc:
                    raise NeuroFedError(f"{raw}: line {n} is not a raw results entry ({exc})") from None
                yield path, obj
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # not gzip, or truncated after line n
        raise NeuroFedError(f"{raw}: line {n + 1} is not a raw results entry ({exc})") from None


def read(raw: Path) -> dict[str, Any]:
    """Every file of ``raw``: relative path -> parsed JSON."""
    return dict(iter_entries(raw))


def pack(root: Path, out: Path, prefixes: Iterable[str] | None = None,
         exclude: Iterable[str] = ()) -> int:
    """Write every ``*.json`` under ``root`` (only paths starting with one of ``prefixes`` if given, none starting
    with one of ``exclude``) into ``out``, in path order; returns the number of files."""
    pre = tuple(p.rstrip("/") + "/" for p in prefixes) if prefixes is not None else None
    exc = tuple(e.rstrip("/") + "/" for e in exclude)
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.json") if p.is_file())
    rels = [r for r in rels if (pre is None or r.startswith(pre) or r + "/" in pre) and not r.startswith(exc)]
    return write(out, ((r, json.loads((root / r).read_text())) for r in rels))


def write(out: Path, entries: Iterable[tuple[str, Any]]) -> int:
    """Write (path, JSON) entries to ``out`` (sorted by path, deterministic gzip); returns the count."""
    rows = sorted(entries, key=lambda e: e[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as fb, gzip.GzipFile(filename="", mode="wb", fileobj=fb, mtime=0, compresslevel=9) as gz:
        for path, obj in rows:
            gz.write((json.dumps({"path": path, "json": obj}, separators=(",", ":")) + "\n").encode())
    tmp.replace(out)
    return len(rows)


def add_runs(raw: Path, root: Path, run_dirs: Iterable[Path]) -> int:
    """Add what a grid finished in ``run_dirs`` (folders inside the results ``root``) to ``raw``, keeping its other
    entries; returns how many entries were added or changed.

    A run's new or changed ``jobs/*.json`` are added, and with them its ``config.json`` and ``results.json``; a run
    none of whose jobs changed is left as the raw file has it (a re-run that only re-summarises a finished run does
    not rewrite its committed summary). Other files in a run folder (a sweep's, an attack's) are not a grid's and
    stay out."""
    entries = read(raw) if raw.is_file() else {}
    n = 0
    for d in map(Path, run_dirs):
        jobs = sorted((d / "jobs").glob("*.json")) if (d / "jobs").is_dir() else []
        changed = []
        for p in jobs:
            rel, obj = p.relative_to(root).as_posix(), json.loads(p.read_text())
            if entries.get(rel) != obj:
                changed.append((rel, obj))
        if not changed:
            continue
        for name in ("config.json", "results.json"):
            if (d / name).is_file():
                changed.append(((d / name).relative_to(root).as_posix(), json.loads((d / name).read_text())))
        for rel, obj in changed:
            if entries.get(rel) != obj:
                entries[rel] = obj
                n += 1
    if n:
        write(raw, entries.items())
    return n


def add_tree(raw: Path, root: Path, dirs: Iterable[Path]) -> int:
    """Add (or update) every ``*.json`` under ``dirs`` (folders inside the results ``root``) in ``raw``: what a
    non-grid command wrote (``neurofed classical``, ``sweep``, ``ensemble``, an attack script); returns how many
    entries were added or changed."""
    entries = read(raw) if raw.is_file() else {}
    n = 0
    for d in map(Path, dirs):
        for p in sorted(d.rglob("*.json")) if d.is_dir() else []:
            rel, obj = p.relative_to(root).as_posix(), json.loads(p.read_text())
            if entries.get(rel) != obj:
                entries[rel] = obj
                n += 1
    if n:
        write(raw, entries.items())
    return n


def unpack(raw: Path, dest: Path, overwrite: bool = False) -> int:
    """Write ``raw``'s files under ``dest`` (files already there are kept unless ``overwrite``); returns how many
    were written."""
    n = 0
    for rel, obj in iter_entries(raw):
        p = dest / rel
        if p.exists() and not overwrite:
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(obj, indent=1))
        n += 1
    return n


def unpack_studies(names: Iterable[str], dest: Path = WORK / "results", studies: Path = STUDIES) -> Path:
    """Unpack the raw files of the named studies into one results root (default ``runs/studies/results``), where
    a study's scripts read ``<group>/<run>/...`` as the grids wrote them; returns the root."""
    for name in names:
        unpack(studies / name / RAW_NAME, dest)
    return dest


def run_results(ref: Path | str) -> list[tuple[str, dict]]:
    """The runs (``results.json``) a raw reference names, in path order: (run path, results).

    ``studies/x/raw.jsonl.gz`` (or ``studies/x``): every run in it; ``...raw.jsonl.gz:table46/ct``: that run;
    ``...raw.jsonl.gz:table46``: every run under that folder.

    Raises
    ------
    NeuroFedError
        No such file, or no run under the inner path (naming the runs the file has).
    """
    raw, inner = split_ref(ref)
    runs = [(p[: -len("/results.json")], obj) for p, obj in iter_entries(raw) if p.endswith("/results.json")]
    chosen = [(p, r) for p, r in runs if not inner or p == inner or p.startswith(inner + "/")]
    if not chosen:
        have = ", ".join(p for p, _ in runs[:12]) + (", ..." if len(runs) > 12 else "")
        raise NeuroFedError(f"{raw}: no run {inner!r} (it holds: {have or 'no runs'})")
    return chosen


__all__ = ["RAW_NAME", "STUDIES", "WORK", "add_runs", "add_tree", "is_raw", "iter_entries", "pack", "read", "run_results", "split_ref",
           "unpack", "unpack_studies", "write"]
