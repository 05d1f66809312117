"""Fails at import, like a plugin whose compiled library is missing."""

raise ImportError("libvendor_kernels.so: cannot open shared object file: No such file or directory")
