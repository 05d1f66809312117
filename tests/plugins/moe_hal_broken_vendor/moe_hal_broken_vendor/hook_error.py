"""Imports fine, but its registration hook raises."""

import moe_hal


@moe_hal.hookimpl
def moe_hal_register_backends(register):
    raise RuntimeError("vendor driver probe crashed while registering")
