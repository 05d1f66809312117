#!/usr/bin/env bash
# Set up a virtual environment from nothing and run the whole test suite on the CPU.
#
#   scripts/test.sh [pytest arguments]
#
# The venv lives in $MOE_HAL_VENV (default .venv). torch is pinned to the 2.13.0 CPU build: an
# unpinned torch would pull a multi-GB CUDA build. Triton runs the CUDA backend's kernels under its
# interpreter; the test plugins in tests/plugins are installed through real entry points.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MOE_HAL_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
pip install --quiet --disable-pip-version-check torch==2.13.0 triton==3.9.0
pip install --quiet --disable-pip-version-check -e ".[test,plot]" -e backends/cuda -e backends/ascend \
    -e tests/plugins/moe_hal_fake_vendor -e tests/plugins/moe_hal_broken_vendor
python -m pytest "$@"
