"""Regenerate the stored golden data, or check that regenerating reproduces it.

``regenerate`` rebuilds every case's data file from its manifest entry (pinned generator plus the
float64 oracle), cross-checks each GEMM golden against the ``reference`` backend (two independent
float64 implementations must agree), writes the files and the sha256 lines of the manifest.
``check`` does the same in memory and reports every file whose bytes differ from the stored hash,
naming the tensors that changed — the test that catches drift between generator, oracle and data.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from ..errors import ConformanceError
from . import suite as suite_mod
from .suite import Case, Suite

FILE_FORMAT = "moe_hal.conformance/1"


@dataclass
class Regenerated:
    """One regenerated data file."""

    case: Case
    blob: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.blob).hexdigest()


def serialize(case: Case, tensors: dict) -> bytes:
    """The safetensors bytes of a case (metadata: case id, file format, generator version)."""
    from safetensors.torch import save

    from .generate import GENERATOR_VERSION

    # One metadata key: safetensors writes a multi-key metadata map in hash order, which would
    # make the file bytes (and their sha256) differ from run to run.
    info = json.dumps({"case": case.id, "format": FILE_FORMAT, "generator_version": GENERATOR_VERSION}, sort_keys=True)
    return save(tensors, metadata={"moe_hal.conformance": info})


def build(case: Case, cross_check: bool = True) -> Regenerated:
    """Generate a case's data; with ``cross_check`` also compare its golden to the reference backend."""
    from .build import case_tensors

    tensors = case_tensors(case)
    if cross_check and case.is_gemm:
        problem = cross_check_reference(case, tensors)
        if problem:
            raise ConformanceError(f"case {case.id}: the oracle and the reference backend disagree: {problem}")
    return Regenerated(case, serialize(case, tensors))


def cross_check_reference(case: Case, tensors: dict) -> str | None:
    """Run the ``reference`` backend on the case's inputs with an fp32 output and compare it with
    the oracle's golden; None when they agree to float64 rounding (a few fp32 ulps)."""
    import torch

    import moe_hal

    from .build import GemmSpec, gemm_call

    spec = GemmSpec.from_case(case)
    call = gemm_call(spec, tensors, torch.device("cpu"))
    out = moe_hal.grouped_gemm(
        call.a,
        call.b,
        call.layout(),
        c=call.c.float() if call.c is not None else None,
        out_dtype=torch.float32,
        backend="reference",
    ).double()
    ref = call.golden.double()
    if not torch.equal(torch.isnan(out), torch.isnan(ref)):
        return "NaN positions differ"
    finite = torch.isfinite(ref)
    if not torch.equal(out[~finite & ~torch.isnan(ref)], ref[~finite & ~torch.isnan(ref)]):
        return "infinite values differ"
    err = (out - ref)[finite].abs()
    bound = (2.0**-22) * (ref[finite].abs() + call.magnitude[finite]) + 1e-30
    if err.numel() and bool((err > bound).any()):
        worst = int(torch.argmax(err / bound))
        return f"max |diff| {float(err.max()):.3e} exceeds the float64-rounding bound (element {worst})"
    return None


def select(suite: Suite, patterns: Iterable[str] = ()) -> list[Case]:
    patterns = list(patterns)
    cases = [c for c in suite.cases if not patterns or any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    if patterns and not cases:
        raise ConformanceError(f"no case matches {patterns}")
    return cases


def regenerate(
    manifest_dir: str | Path,
    patterns: Iterable[str] = (),
    cross_check: bool = True,
    progress: Callable[[Case], None] | None = None,
) -> list[Regenerated]:
    """Rewrite the data files of the suite at ``manifest_dir`` and the sha256 lines of its
    manifest. Returns what was written."""
    root = Path(manifest_dir)
    suite = suite_mod.load(root)
    done = []
    for case in select(suite, patterns):
        if progress:
            progress(case)
        result = build(case, cross_check)
        path = root / case.file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(result.blob)
        done.append(result)
    write_hashes(root / suite_mod.MANIFEST, {r.case.file: r.sha256 for r in done})
    return done


def write_hashes(manifest_path: Path, hashes: dict[str, str]) -> None:
    """Replace the ``sha256:`` line after each ``file:`` line in place (comments survive)."""
    text = manifest_path.read_text(encoding="utf-8")
    for file, digest in hashes.items():
        pattern = re.compile(r"(file: " + re.escape(file) + r"\n\s+sha256: )\"?[0-9a-f]*\"?")
        text, count = pattern.subn(lambda m, digest=digest: m.group(1) + f'"{digest}"', text)
        if count != 1:
            raise ConformanceError(
                f"{manifest_path}: expected one 'file: {file}' followed by a sha256 line, found {count}"
            )
    manifest_path.write_text(text, encoding="utf-8")


@dataclass
class Drift:
    """A data file whose regeneration differs from the manifest."""

    case: Case
    expected: str | None
    actual: str
    detail: str

    def __str__(self) -> str:
        return f"{self.case.id}: {self.case.file}: sha256 {self.actual} != manifest {self.expected} ({self.detail})"


def check(
    suite: Suite | None = None,
    patterns: Iterable[str] = (),
    cross_check: bool = True,
    progress: Callable[[Case], None] | None = None,
) -> list[Drift]:
    """Regenerate in memory; every case whose regenerated bytes or stored file differ from the
    manifest's sha256 is a :class:`Drift` whose ``detail`` names the differing tensors (or says the
    stored file is missing)."""
    suite = suite or suite_mod.load()
    drifts = []
    for case in select(suite, patterns):
        if progress:
            progress(case)
        result = build(case, cross_check)
        if result.sha256 != case.sha256:
            drifts.append(Drift(case, case.sha256, result.sha256, _diff(suite, case, result.blob)))
            continue
        try:
            stored = hashlib.sha256((suite.root / case.file).read_bytes()).hexdigest()
        except (FileNotFoundError, OSError):
            stored = "(missing)"
        if stored != case.sha256:
            drifts.append(
                Drift(
                    case,
                    case.sha256,
                    result.sha256,
                    f"the stored file ({stored}) differs from the manifest and the regeneration: "
                    + _diff(suite, case, result.blob),
                )
            )
    return drifts


def _diff(suite: Suite, case: Case, blob: bytes) -> str:
    import torch
    from safetensors.torch import load

    try:
        stored = load((suite.root / case.file).read_bytes())
    except (FileNotFoundError, OSError):
        return "the stored file is missing"
    fresh = load(blob)

    def same(x: torch.Tensor, y: torch.Tensor) -> bool:
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        return torch.equal(x.contiguous().view(-1).view(torch.uint8), y.contiguous().view(-1).view(torch.uint8))

    changed = sorted(
        k for k in set(stored) | set(fresh) if k not in stored or k not in fresh or not same(stored[k], fresh[k])
    )
    if not changed:
        return "same tensors, different file bytes (safetensors serialization changed?)"
    return "tensors differ: " + ", ".join(changed)
