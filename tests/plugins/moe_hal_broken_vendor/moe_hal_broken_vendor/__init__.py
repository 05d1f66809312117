"""Deliberately broken moe_hal plugins (see tests/plugins/README.md); each module is one failure."""
