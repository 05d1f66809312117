#!/usr/bin/env bash
# Run moe_hal's conformance suite and a small benchmark on a real Ascend NPU, offline.
#
# NOT RUN BY THE MOE_HAL MAINTAINERS: the project had no NPU. Everything in the docs about the
# Ascend backends was verified only through the CPU emulator of torch_npu; the files this script
# writes are the first hardware evidence. Please send them back (an issue with the tarball).
#
# Usage:  backends/ascend/scripts/run_on_npu.sh [OUTPUT_DIR]
# Needs:  CANN (set_env.sh sourced, or found under ASCEND_TOOLKIT_HOME, ASCEND_HOME_PATH,
#         /usr/local/Ascend or ~/Ascend), torch_npu matching torch, moe-hal and moe-hal-ascend
#         installed, one visible NPU (ASCEND_RT_VISIBLE_DEVICES picks which). No network.
# Writes: OUTPUT_DIR/environment.json (CANN version, driver, SoC name and version, hardware-DB
#         match), conformance-<backend>.json/.xml, bench-<backend>[-nz].json, steps.log, and
#         OUTPUT_DIR.tar.gz -- the tarball is written whatever fails; the exit status is non-zero
#         if any step failed.
set -uo pipefail

OUT="${1:-moe-hal-ascend-$(date +%Y%m%d-%H%M%S)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$OUT"
LOG="$OUT/steps.log"
status=0

finish() {
    tar czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null \
        || echo "warning: could not write $OUT.tar.gz" >&2
    echo "results in $OUT/ and $OUT.tar.gz (exit status $status)"
    exit "$status"
}
trap finish EXIT

step() {  # step NAME COMMAND...: run, log, remember a failure, go on
    local name="$1"; shift
    echo "== $name" | tee -a "$LOG"
    "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    if [[ $rc -ne 0 ]]; then
        echo "!! $name failed (exit $rc)" | tee -a "$LOG"
        status=1
    fi
    return "$rc"
}

# The emulator must be off: this run is about the NPU.
unset MOE_HAL_ASCEND_EMULATE MOE_HAL_ASCEND_SOC MOE_HAL_BACKEND MOE_HAL_DISABLE_BACKENDS

# 1. CANN. torch autoloads torch_npu on `import torch`; without CANN on the loader path that import
#    fails with "libhccl.so: cannot open shared object file" (README, "The autoload trap").
find_set_env() {
    local dir
    for dir in "${ASCEND_TOOLKIT_HOME:-}" "${ASCEND_HOME_PATH:-}" \
               /usr/local/Ascend/ascend-toolkit/latest /usr/local/Ascend/ascend-toolkit /usr/local/Ascend/cann \
               "$HOME/Ascend/ascend-toolkit/latest" "$HOME/Ascend/ascend-toolkit"; do
        if [[ -n "$dir" && -f "$dir/set_env.sh" ]]; then
            echo "$dir/set_env.sh"
            return 0
        fi
    done
    # Unusual install prefixes: any set_env.sh of a toolkit a few levels down.
    find /usr/local/Ascend "$HOME/Ascend" -maxdepth 4 -name set_env.sh -path '*toolkit*' 2>/dev/null | sort | head -n 1
}
if [[ -z "${ASCEND_HOME_PATH:-}" || -z "${LD_LIBRARY_PATH:-}" ]]; then
    env_script="$(find_set_env)"
    if [[ -n "$env_script" ]]; then
        echo "sourcing $env_script" | tee -a "$LOG"
        # shellcheck disable=SC1090
        set +eu; source "$env_script"; set -u
    fi
fi
if [[ -z "${ASCEND_HOME_PATH:-}" ]]; then
    echo "error: CANN not found (ASCEND_HOME_PATH unset, no set_env.sh found); source <ascend-toolkit>/set_env.sh" \
         | tee -a "$LOG" >&2
    status=2
    printf '{"error": "CANN not found", "moe_hal_ascend": "not run: no CANN"}\n' > "$OUT/environment.json"
    exit
fi
# With CANN present torch_npu may be autoloaded; our docs tell CPU users to set
# TORCH_DEVICE_BACKEND_AUTOLOAD=0, which would leave torch.device("npu:0") unknown. Every Python
# step below imports torch_npu explicitly before it names an npu device, whatever that variable says.

# 2. Environment capture: CANN version, driver, torch_npu, the device, its SoC name and version, the
#    hardware-DB match, and which Ascend backends are eligible.
step "environment" python - "$OUT/environment.json" <<'EOF'
import glob, json, os, subprocess, sys

report = {"env": {k: v for k, v in os.environ.items()
                  if k.startswith(("ASCEND", "MOE_HAL", "TORCH_DEVICE", "HCCL"))}}

def read(pattern):
    for path in sorted(glob.glob(pattern)):
        try:
            return {"file": path, "text": open(path).read()[:4000]}
        except OSError:
            pass
    return None

home = os.environ.get("ASCEND_HOME_PATH", "")
report["cann_version"] = read(os.path.join(home, "*", "ascend_toolkit_install.info")) or \
    read(os.path.join(home, "version.cfg")) or read(os.path.join(home, "*", "version.cfg"))
report["driver_version"] = read("/usr/local/Ascend/driver/version.info")
try:
    report["npu_smi"] = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=60).stdout[:8000]
except (OSError, subprocess.SubprocessError) as exc:
    report["npu_smi"] = f"npu-smi unavailable: {exc}"

def dump():
    json.dump(report, open(sys.argv[1], "w"), indent=2, default=str)

try:
    import torch
    import torch_npu  # explicit: TORCH_DEVICE_BACKEND_AUTOLOAD=0 must not break the run
    import moe_hal
    from moe_hal import environment
    from moe_hal.backend import DeviceInfo
    report["versions"] = environment.versions()
    report["torch_npu"] = getattr(torch_npu, "__version__", "?")
    name = torch.npu.get_device_name(0)
    props = torch.npu.get_device_properties(0)
    report["device"] = {"name": name, "soc_version": int(torch_npu.npu.get_soc_version()),
                        "cube_core_num": getattr(props, "cube_core_num", None),
                        "vector_core_num": getattr(props, "vector_core_num", None),
                        "total_memory": getattr(props, "total_memory", None)}
    match = moe_hal.match_device("npu:0")
    report["hwdb_match"] = match.to_dict()
    info = DeviceInfo("npu", 0, match.id, frozenset(match.features), match.seen)
    host = moe_hal.plugins.host().ensure_loaded()
    eligible = []
    for spec in moe_hal.backends():
        if spec.vendor != "huawei":
            continue
        backend, err = host.backend(spec.name)
        why = [err] if backend is None else backend.is_available() + backend.check_device(info)
        report.setdefault("backends", {})[spec.name] = [r.as_dict() for r in why]
        if not why:
            eligible.append(spec.name)
    report["eligible_ascend_backends"] = eligible
    print(f"device {name} -> hardware DB {match.id or 'NOT RECOGNISED: ' + str(match.reason)}")
    print("eligible Ascend backends:", ", ".join(eligible) or "none")
except BaseException as exc:  # recorded, never lost: the bundle is the point of this script
    report["error"] = f"{type(exc).__name__}: {exc}"
    dump()
    raise
dump()
sys.exit(0 if report["eligible_ascend_backends"] else "error: no Ascend backend can run on this device")
EOF

BACKENDS=$(python -c "import json, sys; print(' '.join(json.load(open(sys.argv[1])).get('eligible_ascend_backends', [])))" \
           "$OUT/environment.json" 2>/dev/null)

# moe-hal with torch_npu imported first, so that `--device npu:0` parses with any autoload setting.
moe_hal_npu() {
    python -c "import sys, torch_npu; from moe_hal.cli import main; sys.argv[0] = 'moe-hal'; sys.exit(main())" "$@"
}

for backend in $BACKENDS; do
    # 3. The conformance suite on the NPU: the full tier (smoke included) and the seeded sweep.
    step "conformance: $backend" moe_hal_npu conformance run --backend "$backend" --device npu:0 --tier full,sweep \
        --no-progress --report "$OUT/conformance-$backend.json" --junit "$OUT/conformance-$backend.xml"
    # 4. The benchmark: moe_hal vs a per-expert torch.matmul loop vs the bare op, ND and NZ weights.
    step "benchmark: $backend (ND)" python "$HERE/bench_npu.py" --backend "$backend" --out "$OUT/bench-$backend.json"
    MOE_HAL_ASCEND_WEIGHT_FORMAT=nz step "benchmark: $backend (NZ)" python "$HERE/bench_npu.py" --backend "$backend" \
        --out "$OUT/bench-$backend-nz.json"
done
