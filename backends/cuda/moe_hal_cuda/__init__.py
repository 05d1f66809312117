"""moe_hal_cuda: the ``cuda_sm90`` and ``cuda_sm100`` backends of moe_hal (Triton kernels).

Importing this package imports nothing heavy: the plugin module (:mod:`moe_hal_cuda.plugin`) only
declares the backends; triton, ``torch.cuda`` and cuda-python are touched when a backend is first
considered for a call. ``MOE_HAL_CUDA_INTERPRET=1`` runs every kernel under the Triton interpreter
on the CPU (see :mod:`moe_hal_cuda.mode`).
"""

__version__ = "0.1.0"
