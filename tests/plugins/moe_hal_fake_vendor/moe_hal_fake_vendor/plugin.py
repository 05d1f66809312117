"""Hook implementations of the fake vendor; imports nothing heavy, like a real plugin must."""

from pathlib import Path

import moe_hal

_FLOATS = {"fp32", "bf16", "fp16"}

SPEC = moe_hal.BackendSpec(
    name="fake_vendor",
    vendor="example",
    device_types=("cpu",),
    tier="fallback",
    priority=-100,
    impl="moe_hal_fake_vendor.backend:FakeVendorBackend",
    signatures=(moe_hal.Signature(ops={"contiguous", "masked", "k_grouped"}, dtypes=_FLOATS, out_dtypes=_FLOATS),),
    deterministic=True,
    description="test vendor: per-group torch.mm with fp32 accumulation",
)


@moe_hal.hookimpl
def moe_hal_register_backends(register):
    register(SPEC)


@moe_hal.hookimpl
def moe_hal_hardware_db(register):
    register(Path(__file__).with_name("hwdb_overlay.yaml"))


@moe_hal.hookimpl
def moe_hal_conformance_manifest(backend_name):
    if backend_name == "fake_vendor":
        return Path(__file__).with_name("expected_failures.yaml")
    return None


@moe_hal.hookimpl
def moe_hal_ep_transports(register):
    # A transport for a process-group backend of this test vendor's own: listed, never eligible on gloo.
    from moe_hal.plugin_api import ep

    register(
        ep.TransportSpec(
            name="fake_vendor_link",
            impl="moe_hal.ep.transport:AllToAllSingle",
            process_group_backends=("fake_ccl",),
            graph_safe=True,
            priority=5,
            description="test vendor's interconnect",
        )
    )


@moe_hal.hookimpl
def moe_hal_probe_device(device_type, index):
    # A device type of this test vendor's own: recognised by the rule its overlay entry carries.
    if device_type != "fake_accel":
        return None
    from moe_hal import hwdb

    seen = f"Fake Accelerator #{0 if index is None else index}"
    candidates = [e for e in hwdb.all() if "fake_accel" in e.raw["recognition"]]
    return hwdb.decide(candidates, seen, [], "fake accelerator")


@moe_hal.hookimpl
def moe_hal_environment(env_var, package, fact):
    env_var("MOE_HAL_FAKE_VENDOR_MODE", "test vendor's only switch (read by nothing)")
    package("pluggy")  # a distribution surely installed, so reports show a version for it
    fact("fake vendor firmware", lambda: "1.2.3 (fictional)")
