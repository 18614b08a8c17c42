#!/usr/bin/env bash
# Build the documentation site with warnings as errors (CI runs this after the tests: .ci/run).
#
# Installs the runtime (runtime/) and this checkout with the `docs` extra (Sphinx, MyST, sphinx-gallery,
# sphinxcontrib-typer, the theme; pinned in pyproject.toml), then `neurofed docs --fresh`: every page read again and the examples in
# docs/examples executed on the real EEG ($NEUROFED_DATA, default ../shared/data; preprocessing cached in
# $NEUROFED_CACHE). Prints the path of the built index.html. Arguments go to `neurofed docs` (e.g. --open).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PYTHONUNBUFFERED=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
printf 'docs: %s\n' "pip install -e runtime/ && pip install -e '.[docs]'"
pip install -q -e runtime/            # the torch-free runtime: not on PyPI, a dependency of the main package
pip install -q -e '.[docs]'
start=$(date +%s)
neurofed docs --fresh "$@"
printf 'docs: built in %s s\n' "$(( $(date +%s) - start ))"
