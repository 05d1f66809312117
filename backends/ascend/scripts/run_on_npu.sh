#!/usr/bin/env bash
# Run moe_hal's conformance suite and a small benchmark on a real Ascend NPU.
#
# NOT RUN BY THE MOE_HAL MAINTAINERS: the project had no NPU. Everything in the docs about the
# Ascend backends was verified only through the CPU emulator of torch_npu; the files this script
# writes are the first hardware evidence. Please send them back (an issue with the tarball).
#
# Usage:  backends/ascend/scripts/run_on_npu.sh [OUTPUT_DIR]
# Needs:  CANN (set_env.sh sourced, or found at ASCEND_TOOLKIT_HOME / /usr/local/Ascend), torch_npu
#         matching torch, moe-hal and moe-hal-ascend installed, one visible NPU
#         (ASCEND_RT_VISIBLE_DEVICES picks which).
# Writes: OUTPUT_DIR/environment.json, conformance-<backend>.json/.xml (per eligible Ascend backend),
#         bench-<backend>.json, and OUTPUT_DIR.tar.gz.
set -euo pipefail

OUT="${1:-moe-hal-ascend-$(date +%Y%m%d-%H%M%S)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$OUT"

# The emulator must be off: this run is about the NPU.
unset MOE_HAL_ASCEND_EMULATE MOE_HAL_ASCEND_SOC MOE_HAL_BACKEND MOE_HAL_DISABLE_BACKENDS

# 1. CANN. torch autoloads torch_npu on `import torch`; without CANN on the loader path that import
#    fails with "libhccl.so: cannot open shared object file" (README, "The autoload trap").
if [[ -z "${ASCEND_HOME_PATH:-}" ]]; then
    for env_script in "${ASCEND_TOOLKIT_HOME:-}/set_env.sh" /usr/local/Ascend/ascend-toolkit/set_env.sh \
                      "$HOME/Ascend/ascend-toolkit/set_env.sh"; do
        if [[ -f "$env_script" ]]; then
            echo "sourcing $env_script"
            # shellcheck disable=SC1090
            set +u; source "$env_script"; set -u
            break
        fi
    done
fi
if [[ -z "${ASCEND_HOME_PATH:-}" ]]; then
    echo "error: CANN not found (ASCEND_HOME_PATH unset, no set_env.sh found);" \
         "source <ascend-toolkit>/set_env.sh first" >&2
    exit 2
fi

# 2. torch_npu, the device, its SoC and the hardware-DB match; the Ascend backends' availability.
python - "$OUT/environment.json" <<'EOF'
import json, sys
import torch
import moe_hal
from moe_hal import environment, hwdb
from moe_hal.backend import DeviceInfo
from moe_hal_ascend import runtime

report = {"versions": environment.versions(), "env": environment.env_vars()}
reasons = runtime.availability()
report["torch_npu_availability"] = [r.as_dict() for r in reasons]
if reasons:
    json.dump(report, open(sys.argv[1], "w"), indent=2)
    sys.exit("error: torch_npu cannot run here: " + "; ".join(map(str, reasons)))
import torch_npu
name = torch.npu.get_device_name(0)
props = torch.npu.get_device_properties(0)
report["device"] = {"name": name, "soc_version": int(torch_npu.npu.get_soc_version()),
                    "cube_core_num": getattr(props, "cube_core_num", None),
                    "vector_core_num": getattr(props, "vector_core_num", None),
                    "total_memory": getattr(props, "total_memory", None)}
match = hwdb.match("npu:0")
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
json.dump(report, open(sys.argv[1], "w"), indent=2)
print(f"device {name} -> hardware DB {match.id or 'NOT RECOGNISED: ' + str(match.reason)}")
print("eligible Ascend backends:", ", ".join(eligible) or "none")
if not eligible:
    sys.exit("error: no Ascend backend can run on this device (see environment.json)")
EOF

BACKENDS=$(python -c "import json, sys; print(' '.join(json.load(open(sys.argv[1]))['eligible_ascend_backends']))" \
           "$OUT/environment.json")

status=0
for backend in $BACKENDS; do
    # 3. The conformance suite on the NPU: the stored full tier (smoke included) and the seeded sweep.
    echo "== conformance: $backend"
    moe-hal conformance run --backend "$backend" --device npu:0 --tier full,sweep --no-progress \
        --report "$OUT/conformance-$backend.json" --junit "$OUT/conformance-$backend.xml" || status=1
    # 4. The benchmark: moe_hal vs a per-expert matmul loop vs the bare op, ND and NZ weights.
    echo "== benchmark: $backend"
    python "$HERE/bench_npu.py" --backend "$backend" --out "$OUT/bench-$backend.json" || status=1
    MOE_HAL_ASCEND_WEIGHT_FORMAT=nz python "$HERE/bench_npu.py" --backend "$backend" \
        --out "$OUT/bench-$backend-nz.json" || status=1
done

tar czf "$OUT.tar.gz" "$OUT"
echo "results in $OUT/ and $OUT.tar.gz (exit status $status)"
exit $status
