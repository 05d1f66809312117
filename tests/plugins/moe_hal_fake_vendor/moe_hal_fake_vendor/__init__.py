"""A test vendor plugin for moe_hal (see tests/plugins/README.md)."""
