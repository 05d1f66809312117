"""One plugin object per careless behaviour (the entry points name them). Each registers one
backend named ``careless_<behaviour>`` that takes fp32 calls on the CPU with a high priority, so a
careless value that got through would decide every CPU call."""

from __future__ import annotations

from dataclasses import replace

import moe_hal

_SIG = moe_hal.Signature(ops={"contiguous", "masked", "k_grouped"}, dtypes={"fp32"}, out_dtypes={"fp32"})


def spec(name: str, impl: str = "Careful", **fields) -> moe_hal.BackendSpec:
    values = dict(
        name=f"careless_{name}",
        vendor="careless",
        device_types=("cpu",),
        tier="optimized",
        priority=1000,
        impl=f"moe_hal_careless_vendor.backends:{impl}",
        signatures=(_SIG,),
    )
    values.update(fields)
    return moe_hal.BackendSpec(**values)


def plugin(make_specs):
    """A plugin object whose ``moe_hal_register_backends`` registers what ``make_specs()`` returns
    (built inside the hook, so a spec that fails to build fails the hook)."""

    class Plugin:
        @staticmethod
        @moe_hal.hookimpl
        def moe_hal_register_backends(register):
            for s in make_specs():
                register(s)

    return Plugin


def _mutated():
    s = spec("mutated_spec")
    object.__setattr__(s, "tier", "best")  # bypasses the dataclass checks
    return [s]


api_version_none = plugin(lambda: [spec("api_version_none", api_version=None)])
priority_high = plugin(lambda: [spec("priority_high", priority="high")])
signatures_str = plugin(lambda: [spec("signatures_str", signatures=("fp32",))])
mutated_spec = plugin(_mutated)
available_true = plugin(lambda: [spec("available_true", "AvailableTrue")])
available_str = plugin(lambda: [spec("available_str", "AvailableStr")])
mode_none = plugin(lambda: [spec("mode_none", "ModeNone")])
unsupported_str = plugin(lambda: [spec("unsupported_str", "UnsupportedStr")])
auto_reason_str = plugin(lambda: [spec("auto_reason_str", "AutoReasonStr")])
path_int = plugin(lambda: [spec("path_int", "PathInt")])
check_device_raises = plugin(lambda: [spec("check_device_raises", "CheckDeviceRaises")])
results = plugin(
    lambda: [
        replace(spec(kind, impl), priority=-1000 - i)
        for i, (kind, impl) in enumerate(
            (
                ("wrong_shape", "WrongShape"),
                ("wrong_dtype", "WrongDtype"),
                ("returns_none", "ReturnsNone"),
                ("ignores_out", "IgnoresOut"),
                ("raises", "Raises"),
            )
        )
    ]
)
slow_cuda = plugin(lambda: [spec("slow_cuda", "SlowAvailability", device_types=("cuda",))])
