"""The moe_hal conformance cases: ``manifest.yaml`` plus golden tensors under ``data/``.

Installed as the data package ``moe_hal.data.conformance``; run by :mod:`moe_hal.conformance`.
"""
