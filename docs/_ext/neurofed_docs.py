"""Pages of the documentation site that are generated from the code at build time (docs/README.md).

* the command-line reference: every command of every typer app named in pyproject.toml's ``[project.scripts]``,
  one sphinxcontrib-typer directive per command (so the page names each command; each shows its ``--help``);
* the ``federation.toml`` reference: every key of :class:`neurofed.broker.config.FederationConfig` (pydantic),
  with its type, default, bounds and description;
* the ONNX metadata reference: every field of the model card embedded in exported graphs
  (:class:`neurofed.export.runtime.OnnxModelMeta`);
* the studies index: a toctree of whatever ``studies/*/README.md`` exist (none is fine).

The generators are plain functions (tests/test_docs.py calls them without Sphinx); :func:`setup` writes their
pages into ``docs/_generated/`` (not tracked) when Sphinx starts.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import os
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel

from neurofed.broker.config import FederationConfig
from neurofed.export.decoder import StandaloneInfo
from neurofed.export.runtime import META_KEY, OnnxModelMeta
from neurofed.trainer.data.config import PreprocessConfig
from neurofed.trainer.fl.local import LocalConfig
from neurofed.trainer.model_meta import ModelMeta

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "docs" / "_generated"


# ---- command-line reference --------------------------------------------------------------------------------------

def script_apps(root: Path = ROOT) -> dict[str, Any]:
    """The click command of each console script in ``[project.scripts]`` (``"pkg.mod:main"`` -> ``pkg.mod.app``)."""
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    apps = {}
    for name, target in sorted(scripts.items()):
        mod = importlib.import_module(target.split(":", 1)[0])
        app = getattr(mod, "app", None)
        if not isinstance(app, typer.Typer):
            raise RuntimeError(f"[project.scripts] {name} = {target!r}: its module has no typer app named `app`")
        apps[name] = typer.main.get_command(app)
    return apps


def walk_commands(cmd: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    """``[(("neurofed", "bench", "e2e"), command), ...]``: every visible command under ``cmd`` (typer's click
    objects: typer vendors its own click), groups too."""
    out = [(path, cmd)]
    if hasattr(cmd, "list_commands"):
        ctx = cmd.context_class(cmd, info_name=path[-1])
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                out += walk_commands(sub, path + (name,))
    return out


def _attr(path: tuple[str, ...]) -> str:
    return "cmd_" + "__".join(re.sub(r"\W", "_", p) for p in path)


def cli_reference(apps: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The reStructuredText of the CLI reference page and the command objects its directives name (by attribute)."""
    objects: dict[str, Any] = {}
    lines = [
        "Command-line reference",
        "======================",
        "",
        "Generated when the site is built, from the typer apps of the console scripts in ``pyproject.toml``",
        "(``[project.scripts]``): every command, its options and their defaults, as ``--help`` prints them.",
        "Errors NeuroFed raises on purpose print one line and exit with status 2.",
        "",
    ]
    for script, root in apps.items():
        lines += [f"``{script}``", "-" * (len(script) + 4), ""]
        for path, cmd in walk_commands(root, (script,)):
            if len(path) > 1:
                title = f"``{' '.join(path)}``"
                under = "~" if len(path) == 2 else "^"
                lines += [title, under * len(title), ""]
            attr = _attr(path)
            objects[attr] = cmd
            lines += [f".. typer:: neurofed_docs.{attr}", f"   :prog: {' '.join(path)}", "   :preferred: text",
                      "   :width: 90", ""]
    return "\n".join(lines), objects


def undocumented_commands(apps: dict[str, Any]) -> list[str]:
    """Commands whose help text is empty (the reference would show a bare name)."""
    return [" ".join(p) for script, root in apps.items() for p, c in walk_commands(root, (script,))
            if not (c.help or c.short_help or "").strip()]


# ---- federation.toml -----------------------------------------------------------------------------------------------

def _type_name(ann: Any) -> str:
    if ann is None or ann is type(None):
        return "none"
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return " | ".join(f'``"{a}"``' if isinstance(a, str) else f"``{a!r}``" for a in typing.get_args(ann))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(ann))
    if origin in (list, tuple):
        args = [a for a in typing.get_args(ann) if a is not Ellipsis]
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        k, v = typing.get_args(ann) or (str, Any)
        return "table" if v is Any else f"table of {_type_name(v)}"
    return {str: "string", int: "integer", float: "float", bool: "boolean"}.get(ann, getattr(ann, "__name__", str(ann)))


def _toml(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _bounds(field: Any) -> str:
    out = []
    for m in field.metadata:
        for attr, sym in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"), ("min_length", "length ≥"),
                          ("max_length", "length ≤"), ("pattern", "matches")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} ``{v}``")
    return ", ".join(out)


def _cell(text: str) -> str:
    """One Markdown table cell: one line, reST roles (``:class:`x```) as MyST roles (``{class}`x```)."""
    text = re.sub(r":(\w+(?::\w+)?):`", r"{\1}`", " ".join(str(text).split()))
    parts = re.split(r"(`+[^`]*`+)", text)  # outside code spans, "<name>" is text, not an HTML tag
    return "".join(p if p.startswith("`") else p.replace("<", "\\<") for p in parts).replace("|", "\\|")


def _dataclass_rows(section: str, cls: type, defaults: dict[str, Any]) -> list[tuple[str, ...]]:
    hints, docs = typing.get_type_hints(cls), attribute_docs(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if f.name in defaults:
            default = defaults[f.name]
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "(required)"
        rows.append((f"``{section}.{f.name}``", _type_name(hints.get(f.name)), f"``{_toml(default)}``", "",
                     _cell(docs.get(f.name, ""))))
    return rows


def federation_rows() -> list[tuple[str, ...]]:
    """One row per ``federation.toml`` key: (key, type, default, bounds, description)."""
    rows: list[tuple[str, ...]] = []
    for name, field in FederationConfig.model_fields.items():
        section = field.alias or name  # the TOML name (``[async]`` is the field ``async_``)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            for key, sub in ann.model_fields.items():
                default = sub.get_default(call_default_factory=True)
                rows.append((f"``{section}.{key}``", _type_name(sub.annotation), f"``{_toml(default)}``",
                             _bounds(sub), _cell(sub.description or "")))
        elif section == "preprocess":
            default = field.get_default(call_default_factory=True)
            rows += _dataclass_rows(section, PreprocessConfig, default)
        elif section == "local":
            rows += _dataclass_rows(section, LocalConfig, {})
        else:  # a new kind of section: still listed, so the table never silently omits a key
            rows.append((f"``{section}``", _type_name(ann), f"``{_toml(field.get_default(call_default_factory=True))}``",
                         "", _cell(field.description or "")))
    return rows


def federation_reference() -> str:
    """The Markdown page of ``federation.toml`` keys: one definition per key, a heading per section."""
    doc = (FederationConfig.__module__ and importlib.import_module(FederationConfig.__module__).__doc__) or ""
    example = doc.split("Example::", 1)[1] if "Example::" in doc else ""
    lines = [
        "# `federation.toml` keys",
        "",
        "Generated when the site is built from the pydantic model that validates the file",
        "({py:class}`neurofed.broker.config.FederationConfig`): every key, its type, its default and its bounds.",
        "Unknown keys are errors; `neurofed coordinator --config federation.toml` reads it (all defaults when",
        "omitted). `[preprocess]` takes the fields of {py:class}`neurofed.trainer.data.config.PreprocessConfig`",
        "(`channels` may name a preset such as `\"sensorimotor21\"`) and `[local]` those of",
        "{py:class}`neurofed.trainer.fl.local.LocalConfig`; their defaults are the published protocol.",
        "",
    ]
    section = None
    for key, kind, default, bounds, meaning in federation_rows():
        name = key.strip("`")
        if name.split(".")[0] != section:
            section = name.split(".")[0]
            lines += [f"## `[{section}]`", ""]
        lines += [_entry(key, kind, default, bounds, meaning)]
    if example.strip():
        lines += ["## Example", "", "```toml", *[ln[4:] if ln.startswith("    ") else ln
                                                for ln in example.strip("\n").splitlines()], "```", ""]
    return "\n".join(lines)


# ---- ONNX metadata --------------------------------------------------------------------------------------------------

def attribute_docs(cls: type) -> dict[str, str]:
    """Descriptions of a class's fields: its numpy ``Attributes`` section, then ``#:`` comments (via Sphinx)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        text = (klass.__doc__ or "").expandtabs()
        for m in re.finditer(r"^\s*(?:Attributes|Parameters)\n\s*-+\n(.*?)(?=\n\s*\n\s*\S+\n\s*-+\n|\Z)",
                             text, re.S | re.M):
            lines = [ln for ln in m.group(1).splitlines() if ln.strip()]
            indent = min((len(ln) - len(ln.lstrip()) for ln in lines), default=0)
            names: list[str] = []
            for line in lines:
                if len(line) - len(line.lstrip()) == indent:  # "name[, name] : type": a new entry
                    names = [n.strip() for n in line.split(" : ", 1)[0].split(",")]
                else:
                    for n in names:
                        docs[n] = (docs.get(n, "") + " " + line.strip()).strip()
        try:
            from sphinx.pycode import ModuleAnalyzer  # only when Sphinx builds the page

            found = ModuleAnalyzer.for_module(klass.__module__).find_attr_docs()
        except Exception:  # not Sphinx, or a class made at run time (no source to analyse)
            found = {}
        for (qual, name), lines in found.items():
            if qual == klass.__name__:
                docs[name] = " ".join(ln.strip() for ln in lines if ln.strip())
    return docs


def _entry(key: str, kind: str, default: str, bounds: str, meaning: str) -> str:
    """One key as a MyST definition: the key with its type, default and bounds, then what it means."""
    facts = ", ".join(f for f in (kind, f"default {default}", bounds) if f)
    return f"{key} ({facts})\n: {meaning or '—'}\n"


def model_fields(model: type) -> list[tuple[str, Any, Any, str]]:
    """``[(name, annotation, default or REQUIRED, description), ...]`` of a pydantic model or a dataclass."""
    if dataclasses.is_dataclass(model):
        hints = typing.get_type_hints(model)
        out = []
        for f in dataclasses.fields(model):
            default = (f.default if f.default is not dataclasses.MISSING else
                       f.default_factory() if f.default_factory is not dataclasses.MISSING else REQUIRED)
            out.append((f.name, hints.get(f.name), default, ""))
        return out
    return [(k, f.annotation, REQUIRED if f.is_required() else f.get_default(call_default_factory=True),
             f.description or "") for k, f in model.model_fields.items()]


REQUIRED = object()


def _model_entries(model: Any, also: tuple[type, ...] = ()) -> list[str]:
    """Every field of a pydantic model or dataclass as :func:`_entry` definitions."""
    docs: dict[str, str] = {}
    for cls in (*also, model):  # ``also``: classes whose fields the model copies (their descriptions count)
        docs.update(attribute_docs(cls))
    lines = []
    for key, annotation, default, description in model_fields(model):
        shown = "required" if default is REQUIRED else f"``{_toml(default)}``"
        lines.append(_entry(f"``{key}``", _type_name(annotation), shown, "",
                            _cell(description or docs.get(key, ""))).replace("default required", "required"))
    return lines


def onnx_metadata_reference() -> str:
    """The Markdown page of the model card every exported ``.onnx`` carries (``metadata_props``)."""
    lines = [
        "# ONNX metadata contract",
        "",
        "Generated when the site is built from the pydantic models an app validates an exported graph against",
        f"before it decodes a window. An exported `.onnx` holds one `metadata_props` entry, `{META_KEY}`, whose value",
        "is a JSON object with the keys below ({py:class}`neurofed.export.runtime.OnnxModelMeta`: the checkpoint's",
        "model card, {py:class}`neurofed.trainer.model_meta.ModelMeta`, plus what the export adds). It is written by",
        "{py:mod}`neurofed.export.metadata` and read by {py:func}`neurofed.export.runtime.read_onnx_meta`; how apps",
        "use it, and the `model.json` copy for JavaScript runtimes: [](../apps.md).",
        "",
        "## The model card",
        "",
        *_model_entries(OnnxModelMeta, also=(ModelMeta,)),
        "## `standalone`: the standalone graph (`neurofed export --standalone`)",
        "",
        f"Present only in a standalone export ({{py:class}}`{StandaloneInfo.__module__}.StandaloneInfo`, no other keys",
        "allowed): what an app needs to feed the graph raw device windows and carry its state.",
        "",
        *_model_entries(StandaloneInfo),
    ]
    return "\n".join(lines)


# ---- studies ------------------------------------------------------------------------------------------------------

def studies_index(root: Path = ROOT) -> str:
    """A page listing every ``studies/<name>/README.md`` (their own titles in the toctree); none is fine."""
    readmes = sorted((root / "studies").glob("*/README.md")) if (root / "studies").is_dir() else []
    lines = ["# Studies", "",
             "Each study answers one question on the real EEG: its README gives the protocol, the one command",
             "that reproduces it, the expected results and the verdict (how to re-run one:",
             "[Reproduce a study](../howto/reproduce-study.md)).", ""]
    if (root / "studies" / "README.md").is_file():
        lines += ["How a study is laid out, and how to work with one: [the studies' overview](../../studies/README.md).",
                  ""]
    if readmes:
        lines += ["```{toctree}", ":maxdepth: 1", ""]
        lines += [f"/studies/{p.parent.name}/README" for p in readmes]
        lines += ["```", ""]
    else:
        lines += ["No study is published in this checkout yet.", ""]
    return "\n".join(lines)


# ---- pages in no toctree -------------------------------------------------------------------------------------------

_TOCTREE = re.compile(r"^```\{toctree\}[^\n]*\n(?P<body>.*?)^```", re.S | re.M)


def toctree_entries(page: Path, root: Path = ROOT) -> list[str]:
    """The document patterns the toctrees of a Markdown page list, as docnames from ``root`` (globs kept)."""
    out, page = [], page.resolve()
    for m in _TOCTREE.finditer(page.read_text(errors="replace")):
        for line in m.group("body").splitlines():
            line = line.strip()
            if not line or line.startswith(":"):
                continue
            target = re.sub(r"^.*<(.+)>$", r"\1", line).strip().lstrip("?")
            if re.match(r"^[a-zA-Z][\w+.-]*:", target):  # an external link in a toctree
                continue
            base = root if target.startswith("/") else page.parent
            full = (base / target.lstrip("/")).with_suffix("") if target.endswith(".md") else base / target.lstrip("/")
            out.append(Path(os.path.normpath(full)).relative_to(root).as_posix())
    return out


def uncovered_pages(root: Path = ROOT) -> list[str]:
    """docs/ pages that no hand-written toctree lists (a page another change added without a place in the
    contents): the site lists them on a generated page rather than fail on Sphinx's 'not in any toctree'."""
    docs = root / "docs"
    skip = ("docs/_", "docs/auto_examples/", "docs/examples/", "docs/bench/", "docs/results/")
    pages = {p.relative_to(root).with_suffix("").as_posix() for p in docs.rglob("*") if p.suffix in (".md", ".rst")}
    pages = {p for p in pages if not p.startswith(skip) and p != "docs/index"}
    patterns = [e for page in docs.rglob("*.md") if not page.relative_to(root).as_posix().startswith(skip)
                for e in toctree_entries(page, root)]
    return sorted(p for p in pages if not any(fnmatch.fnmatchcase(p, pat) for pat in patterns))


def more_pages(root: Path = ROOT) -> str:
    """The page that gives the uncovered pages (:func:`uncovered_pages`) a place in the contents."""
    pages = uncovered_pages(root)
    lines = ["# More pages", "", "Pages of docs/ that no section lists yet (found when the site was built).", ""]
    if pages:
        lines += ["```{toctree}", ":maxdepth: 1", "", *[f"/{p}" for p in pages], "```", ""]
    else:
        lines += ["None: every page has its place in the sections.", ""]
    return "\n".join(lines)


# ---- Sphinx ----------------------------------------------------------------------------------------------------------

def write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it (an unchanged page is not rebuilt)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def generate(root: Path = ROOT) -> None:
    """Write every generated page into ``docs/_generated/``."""
    out = root / "docs" / "_generated"
    apps = script_apps(root)
    missing = undocumented_commands(apps)
    if missing:
        raise RuntimeError(f"commands without help text (add a docstring): {', '.join(missing)}")
    rst, objects = cli_reference(apps)
    globals().update(objects)  # the names `.. typer:: neurofed_docs.cmd_...` import
    write_if_changed(out / "cli.rst", rst + "\n")
    write_if_changed(out / "federation-toml.md", federation_reference())
    write_if_changed(out / "onnx-metadata.md", onnx_metadata_reference())
    write_if_changed(out / "studies.md", studies_index(root))
    write_if_changed(out / "more.md", more_pages(root))


def skip_member(app: Any, what: str, name: str, obj: Any, skip: bool, options: Any) -> bool | None:
    """Leave out what the API reference should not show: scikit-learn's generated ``set_*_request`` methods."""
    if re.fullmatch(r"set_\w+_request", name):
        return True
    return None


#: Pages read but in no toctree, reached through links only: the repository's README, the studies' overview and
#: their sub-pages (``report.md``, ``table.md`` of each run), and docs/results/ (snapshots on their way out).
ORPHANS = re.compile(r"README|studies/README|studies/[^/]+/.+/.+|studies/[^/]+/(?!README$)[^/]+|docs/results/.+")
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")


def rewrite_links(text: str, doc_dir: Path, is_source: Any) -> str:
    """Make a page's repository links work in the site as they do on GitHub, outside code fences.

    A link to a folder goes to its ``README.md`` (as GitHub shows it), or, when the folder has none that is a page
    of the site, becomes its text; a link to an existing ``.md`` file that is not a page (outside the site's
    sources) becomes a download of that file. Links to missing files are left as they are, so Sphinx reports them.
    """
    def fix(m: re.Match) -> str:
        target = m.group("target")
        if re.match(r"^[a-zA-Z][\w+.-]*:|^#|^/", target):  # a URL, a scheme (path:, inv:), an anchor, absolute
            return m.group(0)
        path, _, anchor = target.partition("#")
        full = (doc_dir / path).resolve()
        if full.is_dir():
            readme = full / "README.md"
            if readme.is_file() and is_source(readme):
                return f"[{m.group('text')}]({path.rstrip('/')}/README.md{'#' + anchor if anchor else ''})"
            return m.group("text")
        if full.is_file() and full.suffix == ".md" and not is_source(full):
            return f"[{m.group('text')}](path:{path})"
        return m.group(0)

    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
            out.append(line)
        else:
            out.append(line if fenced else _LINK.sub(fix, line))
    return "".join(out)


def optional_entries(text: str, doc_dir: Path, exists: Any) -> str:
    """Toctree entries written ``?page`` are kept (as ``page``) when that page exists, else dropped: a section
    names where a page another change adds belongs (e.g. ``?../architecture``) before the page is there."""
    def fix(m: re.Match) -> str:
        body = "".join(
            (ln.replace("?", "", 1) if exists(doc_dir / ln.strip()[1:]) else "")
            if ln.strip().startswith("?") else ln
            for ln in m.group("body").splitlines(keepends=True))
        return m.group(0).replace(m.group("body"), body, 1)

    return _TOCTREE.sub(fix, text)


def read_source(app: Any, docname: str, source: list[str]) -> None:
    """``source-read``: optional toctree entries resolved (:func:`optional_entries`), repository links made to
    work (:func:`rewrite_links`), orphan pages marked as such."""
    env = app.env
    if not env.doc2path(docname).suffix == ".md":
        return

    def is_page(path: Path) -> bool:
        return any(path.with_suffix(suffix).is_file() for suffix in (".md", ".rst"))

    source[0] = optional_entries(source[0], Path(env.doc2path(docname)).parent, is_page)

    def is_source(path: Path) -> bool:
        name = env.path2doc(str(path))
        return name is not None and name in env.found_docs

    source[0] = rewrite_links(source[0], Path(env.doc2path(docname)).parent, is_source)
    if ORPHANS.fullmatch(docname) and not source[0].startswith("---"):
        source[0] = "---\norphan: true\n---\n" + source[0]


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", lambda app, config: generate(ROOT))
    app.connect("autodoc-skip-member", skip_member)
    app.connect("source-read", read_source)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":  # python docs/_ext/neurofed_docs.py federation|onnx|cli: one generated page on stdout
    import sys

    pages = {"federation": federation_reference, "onnx": onnx_metadata_reference,
             "cli": lambda: cli_reference(script_apps())[0], "studies": studies_index}
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which not in pages:
        sys.exit(f"usage: python docs/_ext/neurofed_docs.py {'|'.join(pages)}")
    print(pages[which]())
