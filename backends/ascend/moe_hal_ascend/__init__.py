"""moe_hal_ascend: the ``ascend`` and ``ascend_950`` backends of moe_hal (torch_npu grouped matmul).

Importing this package imports nothing heavy — not torch_npu, not even torch: the plugin module
(:mod:`moe_hal_ascend.plugin`) only declares the backends, and torch_npu is imported when an NPU
call first needs it (:mod:`moe_hal_ascend.runtime`). Without an NPU, the backends run on a CPU
emulator of torch_npu (:mod:`moe_hal_ascend.emulator`) once emulation is switched on::

    MOE_HAL_ASCEND_EMULATE=1 python ...            # emulate an Ascend910B2
    MOE_HAL_ASCEND_EMULATE=Ascend950PR_9579 ...    # emulate a 950

or in code with :func:`enable_emulation` / :func:`disable_emulation`.
"""

from .emulation import config as emulation_config
from .emulation import disable as disable_emulation
from .emulation import enable as enable_emulation
from .emulation import reset as reset_emulation

__version__ = "0.1.0"

__all__ = ["__version__", "disable_emulation", "emulation_config", "enable_emulation", "reset_emulation"]
