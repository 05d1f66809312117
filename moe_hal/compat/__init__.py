"""Drop-in compatibility layers that let code written against another library's API run on moe_hal.

* :mod:`moe_hal.compat.deep_gemm` — DeepGEMM v2.6's grouped-GEMM and scale-layout functions (same
  names, argument order, defaults and in-place ``d``) on every moe_hal backend.
"""
