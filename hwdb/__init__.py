"""The moe_hal hardware database: one YAML file per accelerator, validated by ``schema.json``.

Installed as the data package ``moe_hal.data.hwdb``; loaded by :mod:`moe_hal.hwdb`.
"""
