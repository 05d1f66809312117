"""moe_hal: one grouped-GEMM API for Mixture-of-Experts layers across NVIDIA SM90/SM100,
Huawei Ascend NPUs and the CPU."""

__version__ = "0.1.0"
