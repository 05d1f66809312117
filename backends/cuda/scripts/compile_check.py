"""Compiled-target check of the CUDA backends, CPU only: every kernel variant the backends can
launch, compiled ahead of time for sm90a and sm100a with Triton's own compiler (ptxas ships in
the triton wheel; no GPU is needed).

How the variants are found: for every architecture, operation, dtype, output dtype, memory order
of ``b``, fp8 scale-block recipe and ``c`` (K-grouped) that the plugin's signatures accept and
``unsupported()`` does not refuse, and for every tile the config table offers for that
operation, a call is planned and driven through :meth:`CudaBackend.launch` — the backend's own
operand preparation and launch code — with each Triton kernel replaced by a recorder. The
recorded arguments go through Triton's binder for each target, exactly as a launch on that GPU
would (signature, constexprs, divisibility attributes, options); the distinct results are
compiled once each, in parallel processes.

Shapes are small stand-ins with the specialisation of the DeepSeek-V3 shapes (N, K, strides and
row counts multiples of 16; layout-dependent scalars are never specialised), so the compiled code
is what N=4096/K=7168 or N=7168/K=2048 launches: Triton specialises on divisibility, not on size.
Shapes that are not multiples of 16 compile to other variants, which this check does not cover.

Per variant the JSON table records registers, spill bytes (ptxas), shared memory, TMEM columns,
the MMA instruction, whether ``a`` and ``b`` reach the MMA through async copies (``cp.async``) or
TMA (read from the TTGIR: an operand fed by a plain ``tt.load`` passes through registers every K
step), whether the PTX issues TMA copies at all (``cp.async.bulk.tensor``), and the calls that
launch it. The check fails (exit 1) when a variant does not compile,
spills, needs more than 227 KiB of shared memory, is an SM100 fp8 variant without the
block-scaled MMA (``tcgen05.mma ... block_scale``), or — for tiles of 64+ rows — lacks wgmma
(sm90a) / tcgen05 (sm100a), loads an operand without async copy / TMA, or loads one without
TMA (the stand-in shapes let TMA read every operand; the K-grouped kernel's masked partial
steps at a group's edges load ``edge_a``/``edge_b``, which these rules do not cover).

    python backends/cuda/scripts/compile_check.py --json ci-out/compile_check.json \\
        [--docs backends/cuda/docs/cuda-backend.md] [--jobs 2]

``--docs`` rewrites the generated table in the document (between its ``compile-table`` markers).

Results are cached per variant in ``$MOE_HAL_COMPILE_CACHE`` (default
``~/.cache/moe-hal/compile-check``), keyed by the Triton version, the kernel's source hash (its
jit dependencies included), the target and the bound signature, constexprs, attributes and
options: an unchanged variant is not recompiled; any change to a kernel recompiles its variants.
``--no-cache`` compiles everything.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("MOE_HAL_CUDA_INTERPRET", None)  # compiled kernels, not the interpreter
os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated (silences its warning)

import torch  # noqa: E402 - after the environment set-up above, which must come first

TARGETS = {"sm90": 90, "sm100": 100}
SHARED_LIMIT = 227 * 1024
PIPELINED_FROM_ROWS = 64
MMA_NEEDED = {90: "wgmma.mma_async", 100: "tcgen05.mma"}
DOCS_BEGIN, DOCS_END = "<!-- compile-table:begin -->", "<!-- compile-table:end -->"

# Stand-in sizes: every one a multiple of 16, like the DeepSeek-V3 shapes (see the docstring).
GROUPS, N, K = 2, 512, 1024
ROWS, MAX_M, TOKENS, M_KGROUPED = 512, 256, 512, 256
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# -- the calls the plugin accepts ------------------------------------------------------------------
def _operand(shape, dtype_name: str, block, ue8m0: bool, b_major: str = "k"):
    """A tensor (or QuantizedTensor) of ``shape`` whose memory order of the last two dims is
    ``b_major`` (``k``: row-major, ``n``: a transposed view, ``strided``: every other column)."""
    from moe_hal.quant import quantize_fp8

    if b_major == "n":
        base = torch.ones(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    elif b_major == "strided":
        base = torch.ones(*shape[:-1], 2 * shape[-1])[..., ::2]
    else:
        base = torch.ones(*shape)
    if dtype_name != "fp8_e4m3":
        return base.to(_DTYPES[dtype_name])
    q = quantize_fp8(base.contiguous(), block, ue8m0=ue8m0)
    if b_major == "n":
        data = q.data.transpose(-1, -2).contiguous().transpose(-1, -2)
        return type(q)(data, q.scale, q.block, q.scale_format)
    return q


def calls():
    """(arch, backend, label, Problem) for every call shape the plugin accepts (see the module
    docstring); the caller drops those the backend's signatures or ``unsupported()`` refuse."""
    import moe_hal
    from moe_hal.problem import Problem

    for arch in TARGETS:
        backend = _backend(arch)
        ue8m0 = arch == "sm100"
        for dtype in ("bf16", "fp16", "fp8_e4m3"):
            outs = ("bf16", "fp32") if dtype == "fp8_e4m3" else (dtype, "fp32")
            blocks = [((1, 128), (128, 128)), ((1, 128), (1, 128))] if dtype == "fp8_e4m3" else [(None, None)]
            for out in outs:
                for a_block, b_block in blocks:
                    for b_major in ("k", "n", "strided"):
                        a = _operand((ROWS, K), dtype, a_block, ue8m0)
                        b = _operand((GROUPS, N, K), dtype, b_block, ue8m0, b_major)
                        lay = moe_hal.ContiguousLayout.from_counts([200, 100], alignment=128, num_rows=ROWS)
                        yield (
                            arch,
                            backend,
                            f"contiguous {dtype}->{out} b:{b_major} {_blocks(a_block, b_block)}",
                            Problem.build(a, b, lay, out_dtype=_OUT_DTYPES[out]),
                        )
                        a3 = _operand((GROUPS, MAX_M, K), dtype, a_block, ue8m0)
                        ml = moe_hal.MaskedLayout(torch.tensor([100, 3], dtype=torch.int32), MAX_M)
                        yield (
                            arch,
                            backend,
                            f"masked {dtype}->{out} b:{b_major} {_blocks(a_block, b_block)}",
                            Problem.build(a3, b, ml, out_dtype=_OUT_DTYPES[out]),
                        )
                k_block = (128, 1) if dtype == "fp8_e4m3" else None
                for with_c in (False, True):
                    x = _operand((TOKENS, M_KGROUPED), dtype, k_block, ue8m0)
                    dy = _operand((TOKENS, N), dtype, k_block, ue8m0)
                    kl = moe_hal.KGroupedLayout.from_counts([300, 212])
                    c = torch.zeros(GROUPS, M_KGROUPED, N, dtype=_OUT_DTYPES[out]) if with_c else None
                    yield (
                        arch,
                        backend,
                        f"k_grouped {dtype}->{out}{' +c' if with_c else ''}",
                        Problem.build(x, dy, kl, c=c, out_dtype=_OUT_DTYPES[out]),
                    )


def _blocks(a_block, b_block) -> str:
    return "" if a_block is None else f"scales {a_block[0]}x{a_block[1]}/{b_block[0]}x{b_block[1]}"


def _backend(arch: str):
    from moe_hal_cuda import backend, plugin

    spec = dict(zip(TARGETS, plugin.specs(), strict=True))[arch]
    cls = backend.CudaSM90Backend if arch == "sm90" else backend.CudaSM100Backend
    return cls(spec)


# -- recording the launches ----------------------------------------------------------------------
class _Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __init__(self, name: str, sink: list):
        self.name, self.sink = name, sink

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.sink.append((self.name, args, kwargs))

        return launch


KERNELS = ("contiguous_kernel", "masked_kernel", "k_grouped_kernel")


def record_launches():
    """[(arch, label, config, kernel name, args, kwargs)] for every accepted call x tile."""
    from moe_hal_cuda import configs, kernels

    sink: list = []
    real = {name: getattr(kernels, name) for name in KERNELS}
    for name in KERNELS:
        setattr(kernels, name, _Recorder(name, sink))
    launches, refused = [], []
    try:
        for arch, backend, label, problem in calls():
            reasons = backend.spec.signature_reasons(problem) or backend.unsupported(problem)
            if reasons:
                refused.append({"arch": arch, "call": label, "reasons": [r.code for r in reasons]})
                continue
            for config in configs.candidates(arch, problem.in_dtype, problem.op):
                sink.clear()
                backend.launch(problem, config, problem.new_out())
                for name, args, kwargs in sink:
                    launches.append((arch, label, config, name, args, kwargs))
    finally:
        for name, fn in real.items():
            setattr(kernels, name, fn)
    return launches, refused, real


def bind(fn, capability: int, args, kwargs):
    """What a launch of ``fn`` with these arguments on a ``capability`` GPU compiles:
    (signature, constexprs, attrs, options) from Triton's own binder."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(GPUTarget("cuda", capability, 32))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return signature, constexprs, attrs, options.__dict__


# -- compiling one variant -----------------------------------------------------------------------
_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_store_bytes": re.compile(r"(\d+) bytes spill stores"),
    "spill_load_bytes": re.compile(r"(\d+) bytes spill loads"),
}
_MMA = re.compile(r"\b(wgmma\.mma_async[\w.:]*|tcgen05\.mma[\w.:]*|mma\.sync[\w.:]*)")
_TTGIR_LOAD = re.compile(r"^\s*%([A-Za-z]+)\w* = (tt\.load|ttg\.async_copy_global_to_local|tt\.descriptor_load)\b")
# A TMA copy has no result: it names its destination buffer after the descriptor and coordinates.
_TTGIR_TMA = re.compile(r"^\s*(ttng\.async_tma_copy_global_to_local) %\w+\[[^\]]*\] %([A-Za-z]+)")
TMA_KERNELS = ("contiguous_kernel", "masked_kernel", "k_grouped_kernel")


def operand_feeds(ttgir: str) -> dict[str, list[str]]:
    """How the MMA operands ``a`` and ``b`` are loaded: the load ops whose results (or, for TMA
    copies, destination buffers) the kernels name ``a``/``b`` (Triton keeps the Python names in
    the IR)."""
    feeds: dict[str, list[str]] = {"a": [], "b": []}
    for line in ttgir.splitlines():
        m = _TTGIR_LOAD.match(line)
        if m and m.group(1) in feeds:
            feeds[m.group(1)].append(m.group(2))
        m = _TTGIR_TMA.match(line)
        if m and m.group(2) in feeds:
            feeds[m.group(2)].append(m.group(1))
    return {k: sorted(set(v)) for k, v in feeds.items()}


def _tma_fed(ops: list[str]) -> bool:
    return "ttng.async_tma_copy_global_to_local" in ops or "tt.descriptor_load" in ops


def compile_variant(task: dict) -> dict:
    """Compile one variant (in a worker process) and measure it."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    from moe_hal_cuda import kernels

    fn = getattr(kernels, task["kernel"])
    knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    start = time.perf_counter()
    row = {"ok": False}
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton_compile(
                ASTSource(fn, task["signature"], task["constexprs"], task["attrs"]),
                target=GPUTarget("cuda", task["capability"], 32),
                options=task["options"],
            )
    except Exception as exc:  # noqa: BLE001 - a compile failure is a result to report
        row["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
        row["compile_s"] = round(time.perf_counter() - start, 2)
        return row
    text = log.getvalue()
    for key, pattern in _PTXAS.items():
        values = [int(v) for v in pattern.findall(text)]
        row[key] = max(values) if values else (None if key == "registers" else 0)
    ptx = compiled.asm["ptx"]
    feeds = operand_feeds(compiled.asm["ttgir"])
    row.update(
        ok=True,
        compile_s=round(time.perf_counter() - start, 2),
        shared_bytes=int(compiled.metadata.shared),
        tmem_columns=int(getattr(compiled.metadata, "tmem_size", 0) or 0),
        mma=sorted({m.split(".sync")[0] if m.startswith("wgmma") else m for m in _MMA.findall(ptx)}),
        tma="cp.async.bulk.tensor" in ptx,
        cp_async=bool(re.search(r"cp\.async\.c[ag]\.", ptx)),
        operand_loads=feeds,
        ptxas_log_seen=bool(values) if (values := _PTXAS["registers"].findall(text)) else False,
    )
    return row


def failures_of(variant: dict) -> list[str]:
    """Why ``variant`` fails the check (empty when it passes)."""
    if not variant["ok"]:
        return [f"does not compile: {variant.get('error', '?')[:300]}"]
    out = []
    if not variant["ptxas_log_seen"]:
        out.append("no ptxas report (registers/spills unknown)")
    if variant["spill_store_bytes"] or variant["spill_load_bytes"]:
        out.append(
            f"spills {variant['spill_store_bytes']} B stored / {variant['spill_load_bytes']} B loaded per thread"
        )
    if variant["shared_bytes"] > SHARED_LIMIT:
        out.append(f"shared memory {variant['shared_bytes']} B > {SHARED_LIMIT} B")
    fp8 = any(call.split()[1].startswith("fp8") for call in variant["calls"])
    if variant["capability"] == 100 and fp8 and not any("block_scale" in m for m in variant["mma"]):
        out.append(f"SM100 fp8 tile without the block-scaled MMA (got {variant['mma'] or 'no MMA'})")
    if variant["config"]["block_m"] >= PIPELINED_FROM_ROWS:
        needed = MMA_NEEDED[variant["capability"]]
        if not any(m.startswith(needed) for m in variant["mma"]):
            out.append(f"no {needed} (got {variant['mma'] or 'no MMA'})")
        for operand, ops in variant["operand_loads"].items():
            if not ops or "tt.load" in ops:
                out.append(f"operand {operand} is loaded without async copy / TMA ({ops or 'no load found'})")
            elif variant["kernel"] in TMA_KERNELS and not (_tma_fed(ops) and variant["tma"]):
                out.append(f"operand {operand} is not loaded by TMA ({ops}; the stand-in shapes are 16-byte aligned)")
    return out


# -- main ------------------------------------------------------------------------------------------
def _target_name(capability: int) -> str:
    return {90: "sm90a", 100: "sm100a"}[capability]


def distinct_variants(launches, kernels_by_name) -> list[dict]:
    """Group the recorded launches by what they compile."""
    variants: dict[str, dict] = {}
    for arch, label, config, name, args, kwargs in launches:
        capability = TARGETS[arch]
        signature, constexprs, attrs, options = bind(kernels_by_name[name], capability, args, kwargs)
        key = repr(
            (
                name,
                capability,
                sorted(signature.items()),
                sorted(constexprs.items()),
                sorted(attrs.items()),
                sorted((k, repr(v)) for k, v in options.items()),
            )
        )
        entry = variants.get(key)
        if entry is None:
            entry = variants[key] = {
                "kernel": name,
                "capability": capability,
                "target": _target_name(capability),
                "config": config.as_dict(),
                "calls": [],
                "task": {
                    "kernel": name,
                    "capability": capability,
                    "signature": signature,
                    "constexprs": constexprs,
                    "attrs": attrs,
                    "options": options,
                },
            }
        if label not in entry["calls"]:
            entry["calls"].append(label)
    return list(variants.values())


def _cache_dir() -> Path:
    return Path(os.environ.get("MOE_HAL_COMPILE_CACHE") or Path.home() / ".cache" / "moe-hal" / "compile-check")


#: Bump when compile_variant measures something new or differently (cached rows become stale).
ANALYSIS_VERSION = 2


def _cache_key(variant: dict, fn) -> str:
    import triton

    task = variant["task"]
    text = repr(
        (
            ANALYSIS_VERSION,
            triton.__version__,
            fn.cache_key,
            task["capability"],
            sorted(task["signature"].items()),
            sorted(task["constexprs"].items()),
            sorted(task["attrs"].items()),
            sorted((k, repr(v)) for k, v in task["options"].items()),
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()


def compile_all(variants: list[dict], kernels_by_name: dict, jobs: int, use_cache: bool) -> tuple[list[dict], int]:
    """Results of every variant (cached ones read back); returns (results, how many compiled now)."""
    cache = _cache_dir()
    keys = [_cache_key(v, kernels_by_name[v["kernel"]]) for v in variants]
    results: list[dict | None] = [None] * len(variants)
    if use_cache:
        for i, key in enumerate(keys):
            path = cache / f"{key}.json"
            if path.is_file():
                results[i] = json.loads(path.read_text(encoding="utf-8"))
    todo = [i for i, r in enumerate(results) if r is None]
    if todo:
        with tempfile.TemporaryDirectory(prefix="moe-hal-compile-check-") as triton_cache:
            os.environ["TRITON_CACHE_DIR"] = triton_cache  # fresh: every variant runs ptxas, so its report is seen
            with concurrent.futures.ProcessPoolExecutor(max_workers=max(jobs, 1)) as pool:
                for i, result in zip(todo, pool.map(compile_variant, [variants[i]["task"] for i in todo])):
                    results[i] = result
                    if use_cache and result["ok"]:
                        cache.mkdir(parents=True, exist_ok=True)
                        (cache / f"{keys[i]}.json").write_text(json.dumps(result), encoding="utf-8")
    return results, len(todo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the table")
    parser.add_argument("--docs", type=Path, help="rewrite the generated table in this markdown file")
    parser.add_argument(
        "--check-docs",
        type=Path,
        help="fail when this markdown file's table differs from the generated one (CI: the document cannot go stale)",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiler processes")
    parser.add_argument("--no-cache", action="store_true", help="compile every variant, ignoring cached results")
    opts = parser.parse_args(argv)
    started = time.perf_counter()

    import triton

    launches, refused, real_kernels = record_launches()
    variants = distinct_variants(launches, real_kernels)
    results, compiled_now = compile_all(variants, real_kernels, opts.jobs, not opts.no_cache)
    failed = 0
    for variant, result in zip(variants, results):
        del variant["task"]
        variant.update(result)
        variant["failures"] = failures_of(variant)
        failed += bool(variant["failures"])
    variants.sort(key=lambda v: (v["kernel"], v["capability"], v["config"]["block_m"], v["calls"][0]))
    report = {
        "what": "every Triton kernel variant the cuda_sm90/cuda_sm100 backends launch, compiled ahead of time "
        "(no GPU) with Triton's compiler and the ptxas in its wheel; nothing here ran on a GPU",
        "triton": triton.__version__,
        "torch": torch.__version__,
        "stand_in_shapes": {
            "groups": GROUPS,
            "N": N,
            "K": K,
            "contiguous_rows": ROWS,
            "masked_max_m": MAX_M,
            "k_grouped_tokens": TOKENS,
            "k_grouped_M": M_KGROUPED,
        },
        "limits": {"shared_bytes": SHARED_LIMIT, "pipelined_from_rows": PIPELINED_FROM_ROWS},
        "launches_recorded": len(launches),
        "variants_compiled": len(variants),
        "compiled_in_this_run": compiled_now,
        "variants_failed": failed,
        "refused_calls": refused,
        "elapsed_s": round(time.perf_counter() - started, 1),
        "variants": variants,
    }
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if opts.docs is not None:
        write_docs(opts.docs, report)
    stale = opts.check_docs is not None and docs_table(opts.check_docs) != markdown_table(report)
    if stale:
        print(
            f"FAIL {opts.check_docs}: its compile table differs from this run's; regenerate it with "
            f"--docs {opts.check_docs}"
        )
    for v in variants:
        for why in v["failures"]:
            print(f"FAIL {v['kernel']} {v['target']} {_config_label(v['config'])} ({v['calls'][0]}): {why}")
    print(
        f"compile_check: {len(variants)} distinct variants ({compiled_now} compiled now, the rest cached) from "
        f"{len(launches)} launches, {failed} failing, "
        f"{report['elapsed_s']} s; wrote {opts.json}"
    )
    return 1 if failed or stale else 0


# -- the generated table -----------------------------------------------------------------------------
def _config_label(c: dict) -> str:
    return f"{c['block_m']}x{c['block_n']}x{c['block_k']} w{c['num_warps']} s{c['num_stages']}"


def _dtypes(calls: list[str]) -> str:
    """``dtype->out`` and, where it matters, the memory order of ``b`` of the calls (``b:strided``
    calls run on a K-major copy, so they share the ``b:k`` variant)."""

    def short(call: str) -> str:
        words = call.split()
        return " ".join([words[1]] + [w for w in words[2:] if w.startswith("b:")])

    return ", ".join(sorted({short(c) for c in calls}))


def _feeds(v: dict) -> str:
    def word(ops):
        if _tma_fed(ops):
            return "TMA"
        if ops == ["ttg.async_copy_global_to_local"]:
            return "cp.async"
        return "registers" if "tt.load" in ops else "?"

    return f"a {word(v['operand_loads']['a'])}, b {word(v['operand_loads']['b'])}"


def markdown_table(report: dict) -> str:
    lines = [
        f"Generated by `backends/cuda/scripts/compile_check.py` (triton {report['triton']}): "
        f"{report['variants_compiled']} distinct variants from {report['launches_recorded']} recorded launches, "
        f"{report['variants_failed']} failing; {sum(bool(v.get('tma')) for v in report['variants'])} use TMA "
        "(`cp.async.bulk.tensor` in the PTX). Compiled for the target, never run on it.",
        "",
        "| kernel | target | BM x BN x BK, warps, stages | calls (dtype->out, b order) | regs | spills (B) | smem (KiB) "
        "| TMEM cols | MMA | operands | TMA |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in report["variants"]:
        if not v["ok"]:
            lines.append(
                f"| {v['kernel']} | {v['target']} | {_config_label(v['config'])} | {_dtypes(v['calls'])} "
                f"| compile failed | | | | | | |"
            )
            continue
        spills = v["spill_store_bytes"] + v["spill_load_bytes"]
        mma = (
            ", ".join(
                m.replace("wgmma.mma_async.", "wgmma ").replace("tcgen05.mma.cta_group::1.", "tcgen05 ")
                for m in v["mma"]
            )
            or "none (CUDA cores)"
        )
        lines.append(
            f"| {v['kernel'].removesuffix('_kernel')} | {v['target']} | {_config_label(v['config'])} "
            f"| {_dtypes(v['calls'])} | {v['registers']} | {spills} | {v['shared_bytes'] / 1024:.1f} "
            f"| {v['tmem_columns']} | {mma} | {_feeds(v)} | {'yes' if v['tma'] else 'no'} |"
        )
    return "\n".join(lines)


def docs_table(path: Path) -> str:
    """The table between the markers of ``path`` (empty when it has none)."""
    text = path.read_text(encoding="utf-8")
    if DOCS_BEGIN not in text or DOCS_END not in text:
        return ""
    return text.split(DOCS_BEGIN, 1)[1].split(DOCS_END, 1)[0].strip("\n")


def write_docs(path: Path, report: dict) -> None:
    text = path.read_text(encoding="utf-8")
    if DOCS_BEGIN not in text or DOCS_END not in text:
        raise SystemExit(f"{path}: no {DOCS_BEGIN} ... {DOCS_END} markers")
    head, rest = text.split(DOCS_BEGIN, 1)
    _, tail = rest.split(DOCS_END, 1)
    path.write_text(f"{head}{DOCS_BEGIN}\n{markdown_table(report)}\n{DOCS_END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
