"""Registers a well-formed backend whose implementation module cannot be imported."""

import moe_hal


@moe_hal.hookimpl
def moe_hal_register_backends(register):
    register(
        moe_hal.BackendSpec(
            name="broken_impl",
            vendor="example",
            device_types=("cpu",),
            tier="optimized",
            priority=500,
            impl="moe_hal_broken_vendor.missing_module:Backend",
            signatures=(moe_hal.Signature(ops={"contiguous"}, dtypes={"fp32"}, out_dtypes={"fp32"}),),
        )
    )
