"""Implements a hook whose name is misspelled; the host must reject it instead of ignoring it."""

import moe_hal


@moe_hal.hookimpl
def moe_hal_register_backend(register):  # missing trailing "s"
    raise AssertionError("never called")
