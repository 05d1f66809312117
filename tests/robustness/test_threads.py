"""First use from several threads at once, in every execution mode: native (the CPU backends),
interpreted (the CUDA backends' Triton kernels under the interpreter) and emulated (the Ascend
backends on the torch_npu emulator). Each mode runs in a fresh process, so that plugin discovery,
backend import, selection and the first kernel launch all happen inside the race."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

RACE = textwrap.dedent("""
    import sys, threading, torch, moe_hal
    backend = sys.argv[1] or None
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    lay = moe_hal.ContiguousLayout.from_counts([3, 0, 5], alignment=1)
    mlay = moe_hal.MaskedLayout(torch.tensor([2, 0, 4], dtype=torch.int32), 4)
    klay = moe_hal.KGroupedLayout.from_counts([3, 0, 5])
    calls = [(torch.randn(8, 32, generator=gen).to(dtype), torch.randn(3, 16, 32, generator=gen).to(dtype), lay),
             (torch.randn(3, 4, 32, generator=gen).to(dtype), torch.randn(3, 16, 32, generator=gen).to(dtype), mlay),
             (torch.randn(8, 16, generator=gen).to(dtype), torch.randn(8, 16, generator=gen).to(dtype), klay)]
    barrier = threading.Barrier(8)
    results, failures = {}, []

    def work(i):
        try:
            barrier.wait()
            for j, (a, b, layout) in enumerate(calls):
                results[i, j] = moe_hal.grouped_gemm(a, b, layout, backend=backend).float()
        except Exception as exc:
            failures.append(f"thread {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, "\\n".join(failures[:3])
    for j, (a, b, layout) in enumerate(calls):
        want = moe_hal.grouped_gemm(a, b, layout, backend="reference").float()
        for i in range(8):
            torch.testing.assert_close(results[i, j], want, rtol=2e-2, atol=2e-2)
    print("raced", len(results), "calls on", moe_hal.select(*calls[0], backend=backend).name)
""")

MODES = [
    pytest.param("", {}, id="native"),
    pytest.param("cuda_sm90", {"MOE_HAL_CUDA_INTERPRET": "1", "MOE_HAL_PLUGINS": "cuda"}, id="interpreted-cuda_sm90"),
    pytest.param("ascend", {"MOE_HAL_ASCEND_EMULATE": "1", "MOE_HAL_PLUGINS": "ascend"}, id="emulated-ascend"),
]


@pytest.mark.parametrize("backend,env", MODES)
def test_first_use_from_eight_threads(backend, env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MOE_HAL_") and k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", RACE, backend],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "raced 24 calls" in done.stdout
    if backend:
        assert done.stdout.strip().endswith(backend)
