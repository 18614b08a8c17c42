"""One import root: installed, NeuroFed is ``neurofed.*`` and nothing else.

The folders trainer/, edge/, broker/, export/ and firmware_sim/ stay at the top of the checkout and are
mapped into ``neurofed`` by pyproject's ``[tool.setuptools.package-dir]``. These tests check that the
mapping is complete, that a wheel holds one root, that ``import trainer`` fails where NeuroFed is
installed, that a user's own ``trainer.py``/``export.py``/``broker.py``/``edge.py`` beside their script
cannot shadow NeuroFed, and that nothing built or downloaded is tracked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MAPPED = ("trainer", "edge", "broker", "export", "firmware_sim")
# Built or downloaded artefacts never belong in the repository (git history is no package index).
BINARY_SUFFIXES = (".whl", ".egg", ".tar.gz", ".tgz", ".zip", ".so", ".dylib", ".dll", ".exe", ".onnx",
                   ".pt", ".pth", ".ckpt", ".safetensors", ".edf", ".bin", ".wasm")


def _env_without_checkout() -> dict[str, str]:
    """The environment minus PYTHONPATH: what a user's shell has."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.unit
def test_every_package_folder_is_listed_and_mapped():
    """``[tool.setuptools] packages`` names every folder with an ``__init__.py`` under the mapped roots."""
    tool = PYPROJECT["tool"]["setuptools"]
    package_dir = tool["package-dir"]
    assert {f"neurofed.{m}": m for m in MAPPED}.items() <= package_dir.items()
    found = set()
    for pkg, folder in package_dir.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "node_modules" in rel.parts:
                continue
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    assert found == set(tool["packages"]), (
        f"pyproject's packages list is out of date: missing {sorted(found - set(tool['packages']))}, "
        f"extra {sorted(set(tool['packages']) - found)}")
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts == {"neurofed": "neurofed.cli:main", "edge-client": "neurofed.edge.cli:main",
                       "headset-sim": "neurofed.firmware_sim.cli:main"}


@pytest.mark.integration  # runs git
def test_no_built_or_downloaded_binaries_are_tracked():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    if not files:
        pytest.skip("not a git checkout")
    bad = [f for f in files.splitlines()
           if f.endswith(BINARY_SUFFIXES) and not f.startswith("tests/fixtures/")
           or "/node_modules/" in f or f.startswith(("build/", "dist/"))]
    assert not bad, f"built or downloaded files are tracked (remove them; git history keeps them): {bad}"


@pytest.mark.integration
def test_user_modules_named_like_neurofed_folders_do_not_shadow_it(tmp_path):
    """A user's folder holding its own trainer.py, export.py, broker.py, edge.py and firmware_sim.py (each
    raising on import) runs NeuroFed's CLIs and API from that folder, where ``python -m``/``-c`` put it
    first on sys.path."""
    for name in MAPPED:
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    env = _env_without_checkout()
    runs = {
        "neurofed --help": [sys.executable, "-m", "neurofed.cli", "--help"],
        "neurofed algorithms": [sys.executable, "-m", "neurofed.cli", "algorithms"],
        "edge-client --help": [sys.executable, "-c", "from neurofed.edge.cli import main; main()", "--help"],
        "headset-sim --help": [sys.executable, "-c", "from neurofed.firmware_sim.cli import main; main()",
                               "--help"],
        "the API": [sys.executable, "-c",
                    "import neurofed.trainer.fl.strategies as s, neurofed.broker.protocol, "
                    "neurofed.edge.windowing, neurofed.export.runtime, neurofed.firmware_sim.player; "
                    "print(sorted(s.ALGORITHMS)[:3])"],
    }
    for what, cmd in runs.items():
        r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"{what} from a folder with the user's own modules: {r.stdout}{r.stderr}"
        assert "user's own" not in r.stdout + r.stderr
    r = subprocess.run(runs["neurofed algorithms"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert "safe" in r.stdout and "fedbs" in r.stdout
    # ... and the user's own modules stay theirs.
    r = subprocess.run([sys.executable, "-c", "import trainer"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "the user's own trainer.py was imported" in r.stderr


@pytest.mark.integration
def test_a_wheel_installs_one_root_and_no_generic_names(tmp_path, neurofed_wheel, runtime_wheel):
    """The wheel holds only ``neurofed/`` (with the package data); installed alone in a clean venv,
    ``import trainer`` (or edge, broker, export, firmware_sim) fails and ``neurofed.trainer`` imports."""
    wheel = neurofed_wheel
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"neurofed", wheel.name.split("-py3")[0] + ".dist-info"}
    for must in ("neurofed/trainer/fl/strategies.py", "neurofed/edge/cli.py", "neurofed/broker/coordinator.py",
                 "neurofed/export/runtime.py", "neurofed/firmware_sim/player.py", "neurofed/cli.py",
                 "neurofed/trainer/resources/concepts_minilm.npz", "neurofed/trainer/data/profiles/lab64.json"):
        assert must in names, must
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    py = env_dir / "bin" / "python"
    # the runtime distribution it depends on (its error types are NeuroFed's root ones), from runtime/
    rt_wheel = runtime_wheel
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel), str(rt_wheel)],
                       capture_output=True, text=True, timeout=300, env=_env_without_checkout())
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import importlib, neurofed.trainer.errors as e\n"
            "print('root', e.__file__)\n"
            f"for name in {MAPPED!r}:\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except ModuleNotFoundError:\n"
            "        print('absent', name)\n")
    r = subprocess.run([py, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env=_env_without_checkout())
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"root {env_dir}" in r.stdout
    for name in MAPPED:
        assert f"absent {name}" in r.stdout


@pytest.mark.integration
def test_the_runtime_wheel_installs_one_root_neurofed_runtime(runtime_wheel):
    """runtime/ builds its own wheel (``neurofed-runtime``) holding only ``neurofed_runtime/``, and declares only
    numpy and onnxruntime (pylsl and mne as extras): the main wheel keeps its one root ``neurofed``."""
    wheel = runtime_wheel
    zf = zipfile.ZipFile(wheel)
    roots = {n.split("/")[0] for n in zf.namelist()}
    assert roots == {"neurofed_runtime", wheel.name.split("-py3")[0] + ".dist-info"}
    for must in ("neurofed_runtime/model.py", "neurofed_runtime/decode.py", "neurofed_runtime/channels.py",
                 "neurofed_runtime/guard.py", "neurofed_runtime/errors.py", "neurofed_runtime/lsl.py"):
        assert must in zf.namelist(), must
    meta = zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode()
    requires = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    assert sorted(r.split(";")[0].strip().split("=")[0].split(">")[0] for r in requires if "extra ==" not in r) == [
        "numpy", "onnxruntime"]
    assert any("pylsl" in r and "extra" in r for r in requires) and any("mne" in r and "extra" in r for r in requires)
    # the main package depends on it by name (installed from runtime/ first: it is not on PyPI)
    assert any(d.startswith("neurofed-runtime") for d in PYPROJECT["project"]["dependencies"])
