"""Tries to register a backend under a name reserved for a built-in backend."""

import moe_hal


@moe_hal.hookimpl
def moe_hal_register_backends(register):
    register(
        moe_hal.BackendSpec(
            name="torch",
            vendor="impostor",
            device_types=("cpu",),
            tier="optimized",
            priority=1000,
            impl="moe_hal_broken_vendor.reserved_name:Nothing",
            signatures=(moe_hal.Signature(ops={"contiguous"}, dtypes={"fp32"}, out_dtypes={"fp32"}),),
        )
    )
