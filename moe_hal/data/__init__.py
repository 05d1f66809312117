"""Packaged data: the hardware database (``hwdb/``) and the conformance cases (``conformance/``).

Both live at the top of the repository and are mapped into this package by ``pyproject.toml``,
so an installed wheel carries them and ``importlib.resources.files("moe_hal.data.hwdb")`` finds them.
"""
