"""moe_hal's conformance suite (stored smoke + full tiers) on the Ascend backends, emulated.

The suite's own runner resolves the backend as it would on any machine: with no NPU it picks the
CPU, where the backends run on the torch_npu emulator, and the run is labelled ``emulated``.
"""

from __future__ import annotations

import collections

import pytest
from ascend_helpers import SOC_910B, SOC_910C, SOC_950

from moe_hal.conformance import runner, suite


@pytest.mark.filterwarnings("ignore::moe_hal.errors.PathWarning")  # the announced upcast / dequantize paths
@pytest.mark.parametrize(
    "soc, backend", [(SOC_910B, "ascend"), (SOC_910C, "ascend"), (SOC_950, "ascend_950"), (SOC_950, "ascend")]
)
def test_full_tier_passes_emulated(emulate, soc, backend):
    emulate(soc)
    target = runner.Target.resolve(backend)
    assert target.available, target.reasons
    assert target.mode == "emulated" and target.device.type == "cpu"
    cases = suite.load()
    run = runner.Runner(target, cases)
    statuses = collections.Counter()
    problems = []
    for case, path in run.items(cases.select(["smoke", "full"])):
        result = run.run_case(case, path)
        statuses[result.status] += 1
        if case.op in suite.GEMM_OPS and result.status != "pass":
            problems.append(result.message)
        elif case.op not in suite.GEMM_OPS and result.status not in ("pass", "not_applicable"):
            problems.append(result.message)
    assert not problems, "\n".join(problems)
    assert statuses["pass"] > 0
