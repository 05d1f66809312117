"""Recognising a device: the recognition rules of the entries, applied to what was observed.

The ``match_*`` functions are pure: they take the observed properties (faked values welcome) and
read only the database. Observing a real device is the plugins' job (hook ``moe_hal_probe_device``,
whose implementations call these functions); :func:`moe_hal.match_device` asks them.
"""

from __future__ import annotations

import os
import platform
import re

from .entry import HardwareEntry, Match
from .loading import ENV_VAR, all

__all__ = ["cpu_model", "decide", "match_cpu", "match_cuda", "match_npu"]

#: Observed names are matched on this many characters at most: with the limits the loader puts on
#: recognition patterns (no nested repeats, at most three), matching then takes bounded time.
MAX_NAME_CHARS = 256


def decide(candidates: list[HardwareEntry], seen: str, rejected: list[str], kind: str) -> Match:
    """The :class:`Match` for a device described by ``seen``: the one candidate entry; none when
    several match (ambiguous) or none does (``rejected`` says why near misses were refused).
    ``kind`` names the device type in the reason. Plugins that recognise their own device types
    use it too, so every recogniser reports the same way."""
    if len(candidates) == 1:
        return Match(candidates[0], seen, None)
    if len(candidates) > 1:
        ids = ", ".join(e.id for e in candidates)
        files = "; ".join(f"{e.id}: {e.path}" for e in candidates)
        return Match(
            None,
            seen,
            f"ambiguous: {len(candidates)} entries match ({ids}); make their recognition patterns exclusive ({files})",
        )
    reason = f"no hardware-DB entry recognises this {kind} device"
    if rejected:
        reason += ": " + "; ".join(rejected)
    else:
        reason += f"; add one with {ENV_VAR} (see docs/hwdb.md)"
    return Match(None, seen, reason)


def match_cuda(name: str, major: int, minor: int, sm_count: int | None = None) -> Match:
    """Recognise a CUDA device from its properties (as ``torch.cuda.get_device_properties``
    reports them). Pure: no device is touched, so faked values can be passed."""
    seen = f"{name} (cc {major}.{minor}" + (f", {sm_count} SMs)" if sm_count is not None else ")")
    cc = f"{major}.{minor}"
    candidates, rejected = [], []
    for entry in all():
        rule = entry.raw["recognition"].get("cuda")
        if rule is None or not re.search(rule["name_pattern"], name[:MAX_NAME_CHARS], re.IGNORECASE):
            continue
        if "name_exclude" in rule and re.search(rule["name_exclude"], name[:MAX_NAME_CHARS], re.IGNORECASE):
            continue
        if rule["compute_capability"] != cc:
            rejected.append(
                f"{entry.id} matches the name but has compute capability {rule['compute_capability']}, not {cc}"
            )
            continue
        units = entry.quantity("compute.units")
        if rule.get("require_sm_count") and sm_count is not None and units is not None and sm_count != units.value:
            rejected.append(
                f"{entry.id} matches the name but has {int(units.value)} SMs, not {sm_count} "
                "(a MIG slice or a different board?)"
            )
            continue
        candidates.append(entry)
    return decide(candidates, seen, rejected, "CUDA")


def match_npu(soc_name: str, soc_version: int | None = None) -> Match:
    """Recognise an Ascend NPU from its SoC name (``torch.npu.get_device_name``) and, when given,
    ``torch_npu.npu.get_soc_version()``. Pure: faked values can be passed. A name no pattern
    knows (a new spelling of a known SKU) is matched by the version when one entry alone lists it."""
    seen = soc_name + (f" (soc_version {soc_version})" if soc_version is not None else "")
    candidates, rejected, by_version = [], [], []
    for entry in all():
        rule = entry.raw["recognition"].get("npu")
        if rule is None:
            continue
        versions = rule.get("soc_versions")
        if not re.fullmatch(rule["soc_name_pattern"], soc_name.strip()[:MAX_NAME_CHARS]):
            if soc_version is not None and versions and soc_version in versions:
                by_version.append(entry)
            continue
        if soc_version is not None and versions and soc_version not in versions:
            rejected.append(f"{entry.id} matches the SoC name but expects soc_version in {versions}, not {soc_version}")
            continue
        candidates.append(entry)
    if not candidates and not rejected and len(by_version) == 1:
        return Match(by_version[0], seen + " [recognised by soc_version]", None)
    return decide(candidates, seen, rejected, "NPU")


def match_cpu(model: str | None = None, logical_cpus: int | None = None) -> Match:
    """Recognise the CPU: an entry whose ``model_pattern`` finds ``model``, else the generic
    CPU entry. Without arguments, describes this machine's CPU."""
    if model is None:
        model = cpu_model()
    if logical_cpus is None:
        logical_cpus = os.cpu_count()
    seen = model + (f" ({logical_cpus} logical CPUs)" if logical_cpus else "")
    specific, generic = [], []
    for entry in all():
        rule = entry.raw["recognition"].get("cpu")
        if rule is None:
            continue
        pattern = rule.get("model_pattern")
        if pattern is None:
            generic.append(entry)
        elif re.search(pattern, model[:MAX_NAME_CHARS], re.IGNORECASE):
            specific.append(entry)
    return decide(specific or generic, seen, [], "CPU")


def cpu_model() -> str:
    """This machine's CPU model name (``/proc/cpuinfo``, else what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
