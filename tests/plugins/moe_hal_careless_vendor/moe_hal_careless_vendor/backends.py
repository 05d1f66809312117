"""Backends that answer a probe, or run(), with a value of the wrong kind."""

from __future__ import annotations

import time

import torch

import moe_hal


class Careful(moe_hal.Backend):
    """Correct: float32 products through the reference backend's arithmetic."""

    def run(self, problem, out):
        return moe_hal.get_backend("reference").run(problem, out)


class AvailableTrue(Careful):
    def is_available(self):
        return True


class AvailableStr(Careful):
    def is_available(self):
        return "yes, available"


class ModeNone(Careful):
    def execution_mode(self, device):
        return None


class UnsupportedStr(Careful):
    def unsupported(self, problem):
        return "K too large"


class AutoReasonStr(Careful):
    def auto_select_reason(self, device):
        return "only when named"


class PathInt(Careful):
    def describe_path(self, problem):
        return 42


class CheckDeviceRaises(Careful):
    def check_device(self, device):
        raise RuntimeError("driver exploded")


class WrongShape(Careful):
    def run(self, problem, out):
        return torch.zeros(1)


class WrongDtype(Careful):
    def run(self, problem, out):
        return torch.zeros(problem.out_shape(), dtype=torch.float64)


class ReturnsNone(Careful):
    def run(self, problem, out):
        super().run(problem, out)
        return None


class IgnoresOut(Careful):
    def run(self, problem, out):
        return super().run(problem, None)


class Raises(Careful):
    def run(self, problem, out):
        if out is not None:
            out.fill_(float("nan"))  # partially written before failing
        raise IndexError("tile index out of range")


class SlowAvailability(Careful):
    """A CUDA-only backend whose availability probe takes a while (a driver initialising)."""

    calls = 0

    def is_available(self):
        type(self).calls += 1
        time.sleep(0.5)
        return []
