#!/usr/bin/env bash
# Set up a virtual environment from nothing and run the whole test suite on the CPU.
#
#   scripts/test.sh [pytest arguments]
#
# The venv lives in $MOE_HAL_VENV (default .venv-test): a venv of the tests' own, because they
# install the deliberately broken test plugins, which would make every `moe-hal` call of a user's
# .venv print plugin warnings. torch is pinned to the 2.13.0 CPU build: an
# unpinned torch would pull a multi-GB CUDA build. Triton runs the CUDA backend's kernels under its
# interpreter; the test plugins in tests/plugins are installed through real entry points.
# The core and each plugin are tested in their own pytest process, as separate repositories would
# be: the plugins' conftests switch on their interpreter/emulator modes before anything imports.
# With $MOE_HAL_TEST_REPORTS set, each suite also writes JUnit XML into that directory.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MOE_HAL_VENV:-.venv-test}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
pip install --quiet --disable-pip-version-check torch==2.13.0 triton==3.9.0
pip install --quiet --disable-pip-version-check -e ".[test,plot]" -e backends/cuda -e backends/ascend \
    -e tests/plugins/moe_hal_fake_vendor -e tests/plugins/moe_hal_broken_vendor
status=0
for suite in tests backends/cuda/tests backends/ascend/tests; do
    echo "== pytest $suite"
    junit=()
    if [ -n "${MOE_HAL_TEST_REPORTS:-}" ]; then
        mkdir -p "$MOE_HAL_TEST_REPORTS"
        junit=("--junitxml=$MOE_HAL_TEST_REPORTS/$(echo "$suite" | tr / _).xml")
    fi
    python -m pytest "$suite" ${junit[@]+"${junit[@]}"} "$@" || status=$?
done
exit "$status"
