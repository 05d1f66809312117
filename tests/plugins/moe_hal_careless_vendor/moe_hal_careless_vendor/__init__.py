"""Careless moe_hal plugins: each entry point returns a bad *value* somewhere (a malformed spec, a
probe answering the wrong type, a run() breaking the output contract) instead of raising."""
