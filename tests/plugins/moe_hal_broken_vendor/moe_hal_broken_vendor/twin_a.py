"""One of two plugins registering the same backend name; neither may win silently."""

import moe_hal


@moe_hal.hookimpl
def moe_hal_register_backends(register):
    register(
        moe_hal.BackendSpec(
            name="twin",
            vendor="example-a",
            device_types=("cpu",),
            tier="optimized",
            priority=900,
            impl="moe_hal_fake_vendor.backend:FakeVendorBackend",
            signatures=(moe_hal.Signature(ops={"contiguous"}, dtypes={"fp32"}, out_dtypes={"fp32"}),),
        )
    )
