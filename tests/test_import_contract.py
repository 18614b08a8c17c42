"""The import contract (pyproject.toml ``[tool.importlinter]``): layers that point one way, and no cycle.

Layers, highest first (a module imports only from its own layer or lower ones): CLIs > the CLIs' shared options >
lab (demo, benches, experiments, reports) > services (broker, edge, export, firmware_sim) > wire (MQTT protocol,
transport) and runtime (exported models on onnxruntime + numpy) > core (trainer's data, models, fl, checkpoints).

import-linter (grimp) finds packages on disk under their import names, but the checkout keeps trainer/, edge/,
broker/, export/ and firmware_sim/ at its top (pyproject's ``[tool.setuptools.package-dir]`` maps them into
``neurofed.*``). So these tests build a staging tree ``<tmp>/neurofed/...`` by that mapping and check it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the runtime distribution's package (runtime/, its own wheel), linted with the main package
RUNTIME_PKG = ROOT / "runtime" / "neurofed_runtime"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
OLD_ROOTS = {name.split(".")[-1] for name in PACKAGE_DIR if name != "neurofed"}


def _contracts() -> dict[str, dict]:
    return {c["id"]: c for c in PYPROJECT["tool"]["importlinter"]["contracts"]}


def _sources() -> dict[str, Path]:
    """``{module name: source file}`` of every installed module, by pyproject's package-dir mapping (a folder mapped
    to a deeper package is left to that mapping)."""
    out: dict[str, Path] = {}
    for pkg, folder in PACKAGE_DIR.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if any(not (base.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
                continue  # not inside a package (e.g. a stray script folder)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([pkg, *parts])
            owner = max((p for p in PACKAGE_DIR if name == p or name.startswith(p + ".")), key=len)
            if owner == pkg:
                out[name] = path
    return out


SOURCES = _sources()


@pytest.fixture(scope="module")
def staging(tmp_path_factory) -> Path:
    """``<tmp>/neurofed/...``: the installed layout, files hard-linked (copied across file systems)."""
    tmp = tmp_path_factory.mktemp("staging")
    for name, src in SOURCES.items():
        parts = name.split(".")
        dest = tmp.joinpath(*parts, "__init__.py") if src.name == "__init__.py" else tmp.joinpath(*parts[:-1],
                                                                                                      f"{parts[-1]}.py")
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copy2(src, dest)
    shutil.copytree(RUNTIME_PKG, tmp / "neurofed_runtime", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp


def _layer_entries() -> list[list[str]]:
    layers = _contracts()["layers"]["layers"]
    return [[m.strip() for m in layer.replace("|", ":").split(":")] for layer in layers]


def _layer_of(module: str) -> int | None:
    for i, entries in enumerate(_layer_entries()):
        if any(module == e or module.startswith(e + ".") for e in entries):
            return i
    return None


def test_lint_imports_on_the_staging_tree(staging):
    """import-linter on the installed layout: every contract of pyproject.toml is kept."""
    pytest.importorskip("importlinter", reason="import-linter is not installed (pip install 'neurofed[dev]')")
    env = {**os.environ, "PYTHONPATH": str(staging)}
    # `lint-imports` of this interpreter (whose import path then starts with the staging tree)
    cmd = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
           "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"]
    res = subprocess.run(cmd, cwd=staging, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"import contract broken:\n{res.stdout[-6000:]}\n{res.stderr[-2000:]}"


def test_no_import_cycle(staging, monkeypatch):
    """No two neurofed modules import each other, directly or through others (function-level imports count)."""
    grimp = pytest.importorskip("grimp")
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    monkeypatch.syspath_prepend(str(staging))
    for name in [m for m in sys.modules if m == "neurofed" or m.startswith("neurofed.")]:
        monkeypatch.delitem(sys.modules, name)  # grimp must find the staging tree, not the editable install
    graph = grimp.build_graph("neurofed", cache_dir=None)
    mods = sorted(graph.modules)
    index = {m: i for i, m in enumerate(mods)}
    rows, cols = [], []
    for m in mods:
        for dep in graph.find_modules_directly_imported_by(m):
            rows.append(index[m])
            cols.append(index[dep])
    n, labels = connected_components(csr_matrix(([1] * len(rows), (rows, cols)), shape=(len(mods), len(mods))),
                                     directed=True, connection="strong")
    cycles = [sorted(m for m, lab in zip(mods, labels) if lab == c) for c in range(n)]
    cycles = [c for c in cycles if len(c) > 1]
    assert not cycles, "import cycles (strongly connected modules):\n" + "\n".join(", ".join(c) for c in cycles)


def _internal_imports(path: Path, module: str) -> list[tuple[int, str, bool]]:
    """``(line, imported module, inside a function)`` of every import of a neurofed module (relative included)."""
    is_pkg = path.name == "__init__.py"
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((child.lineno, a.name, in_func) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[: len(base) - child.level + 1]
                    found.append((child.lineno, ".".join(base + ([child.module] if child.module else [])), in_func))
                elif child.module:
                    found.append((child.lineno, child.module, in_func))
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def test_every_module_is_in_a_layer():
    """No module is left out of the layers contract (package ``__init__`` files that only hold a logger or
    re-export their own submodules are containers, not modules of a layer)."""
    missing = []
    for name, path in SOURCES.items():
        if _layer_of(name) is not None:
            continue
        if path.name == "__init__.py" and all(dep == name or dep.startswith(name + ".") or not dep.startswith("neurofed")
                                              for _, dep, _ in _internal_imports(path, name)):
            continue
        missing.append(name)
    assert not missing, f"modules in no layer of pyproject's layers contract: {missing}"


def test_no_import_of_the_old_top_level_names():
    """``import trainer`` etc. would be satisfied by the checkout's top-level folders in tests, never when installed."""
    bad = []
    for name, path in SOURCES.items():
        for line, dep, _ in _internal_imports(path, name):
            if dep.split(".")[0] in OLD_ROOTS:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {dep}")
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for line, dep, _ in _internal_imports(path, "tests.x"):
            if dep.split(".")[0] in OLD_ROOTS:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {dep}")
    assert not bad, "\n".join(bad)


def test_function_level_imports_say_why():
    """An import of a neurofed module inside a function is there only to defer a heavy or optional dependency,
    and says so in a comment on its line (e.g. ``# lazy: torch (keeps --help fast)``)."""
    bad = []
    for name, path in SOURCES.items():
        lines = path.read_text().splitlines()
        for line, dep, in_func in _internal_imports(path, name):
            if in_func and dep.split(".")[0] == "neurofed":
                text = lines[line - 1]
                end = line - 1
                while "(" in text and ")" not in lines[end] and end + 1 < len(lines):
                    end += 1
                if not any("#" in lines[i] for i in range(line - 1, end + 1)):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {text.strip()}")
    assert not bad, ("function-level imports of neurofed modules without a comment saying why (hoist them to "
                     "module level, or add e.g. '# lazy: torch'):\n" + "\n".join(bad))


def test_contract_covers_every_rule_and_core_module():
    c = _contracts()
    assert c["layers"]["type"] == "layers"
    assert set(c["core-no-transport"]["forbidden_modules"]) >= {"paho", "pylsl", "mne_lsl"}
    assert set(c["export-services-alone"]["forbidden_modules"]) >= {"neurofed.edge", "neurofed.broker"}
    assert set(c["broker-services-alone"]["forbidden_modules"]) >= {"neurofed.edge", "neurofed.export"}
    fw = set(c["firmware-sim-alone"]["forbidden_modules"])
    assert fw >= {"neurofed.broker", "neurofed.edge", "neurofed.export"}
    # firmware_sim may use neurofed.trainer.data, .errors and .atomic (the data cache's atomic writer) of core only
    core = next(e for e in _layer_entries() if "neurofed.trainer.data" in e)
    assert _layer_entries()[-1] == ["neurofed_runtime"]  # the runtime distribution is the bottom layer
    assert {"neurofed", "torch", "onnx", "pydantic"} <= set(c["runtime-distribution-alone"]["forbidden_modules"])
    assert set(core) - {"neurofed.trainer.data", "neurofed.trainer.errors", "neurofed.trainer.atomic"} == {
        m for m in fw if m.startswith("neurofed.trainer.")}
    assert set(c["core-no-transport"]["source_modules"]) == set(core)


def test_runtime_imports_no_torch():
    """The runtime layer (exported models on onnxruntime + numpy) loads without torch: a fresh interpreter."""
    code = ("import sys, neurofed_runtime.decode, neurofed_runtime.lsl, neurofed.export.runtime, "
            "neurofed.export.decoder; "
            "bad = sorted(m for m in ('torch', 'mne', 'sklearn') if m in sys.modules); "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"importing the runtime imported {res.stdout.strip()} {res.stderr[-2000:]}"


def test_the_cli_loads_no_pylsl():
    """`neurofed demo` gives its process a private LSL session before pylsl loads: building the CLI must not load it
    (a benchmark module imported at the top of neurofed.cli once did, and the demo refused to start)."""
    code = "import sys, neurofed.cli, neurofed.edge.cli; sys.exit(1 if 'pylsl' in sys.modules else 0)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"importing the CLIs loaded pylsl {res.stderr[-2000:]}"
