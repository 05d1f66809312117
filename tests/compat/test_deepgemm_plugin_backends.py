"""DeepGEMM's test structure (``test_deepgemm_cases.py``) on the plugin backends at small sizes:
``cuda_sm90``/``cuda_sm100`` with their kernels under the Triton interpreter, ``ascend`` and
``ascend_950`` on the CPU emulator. Each runs in its own process, since both modes must be chosen before triton or the
plugin is imported (as the plugins' own test suites do)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

CASES = pathlib.Path(__file__).with_name("test_deepgemm_cases.py")
MODES = {
    "cuda_interpreted": {
        "MOE_HAL_CUDA_INTERPRET": "1",
        "MOE_HAL_PLUGINS": "cuda",
        "MOE_HAL_COMPAT_BACKENDS": "cuda_sm90,cuda_sm100",
    },
    "ascend_emulated": {
        "MOE_HAL_ASCEND_EMULATE": "1",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "MOE_HAL_PLUGINS": "ascend",
        "MOE_HAL_COMPAT_BACKENDS": "ascend",
    },
    # the emulator posing as an Ascend 950PR: fp8 M-grouped calls in the op's native G-B mode
    "ascend_950_emulated": {
        "MOE_HAL_ASCEND_EMULATE": "Ascend950PR_9579",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "MOE_HAL_PLUGINS": "ascend",
        "MOE_HAL_COMPAT_BACKENDS": "ascend_950",
    },
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_deepgemm_cases_on_plugin_backends(mode):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOE_HAL_")}
    env.update(MODES[mode], MOE_HAL_COMPAT_SMALL="1")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(CASES),
            "-k",
            "not sf_layout and not casts",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
