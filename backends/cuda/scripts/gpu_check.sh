#!/usr/bin/env bash
# One device call that produces every GPU result of the CUDA backend, in at most ~8 minutes:
#
#   1. make the local packages importable without network (editable install, else a copied site dir);
#   2. bench/calibrate.py        -> $OUT/measured_overlay.yaml   (hardware calibration, <= 75 s)
#   3. backends/cuda/scripts/gpu_check.py        -> $OUT/gpu_check.json          (GPU-only checks, correctness, timings,
#      targets, <= 350 s; the exit status of this script is gpu_check.py's: non-zero when a check fails)
#      with the calibration overlay loaded (MOE_HAL_HWDB), so the model uses this card's ceilings;
#   plus $OUT/gpu_check.log with everything printed. The performance model's error on the timings is
#   computed afterwards, without a GPU, from the committed JSON: backends/cuda/scripts/gpu_check_cases.py
#   turns it into bench/own_measurements/<run>.yaml, which `moe-hal model calibrate` fits.
#
# It installs nothing from the network. The kernel checks need nothing the nvidia-h200 image lacks;
# the hardware DB (the tile advisor, the model figures, calibration) needs jsonschema, taken from
# wheels in .whl/ when that folder is carried with the call (see backends/cuda/docs/cuda-backend.md). Call it from the repository root:
#
#   run(command="bash backends/cuda/scripts/gpu_check.sh", carry=[".whl"], timeout_s=540)
#
# Without $OUT (outside the device tool) results go to bench/results/gpu_check_local/.
# GPU_CHECK_SMOKE=1 runs the same flow on a machine without a GPU: gpu_check.py --cpu-smoke (Triton
# interpreter, tiny shapes) and calibration of the CPU into $OUT only.
set -u -o pipefail
cd "$(dirname "$0")/../../.."  # the repository root: the check also runs the core's bench/ tools
OUT=${OUT:-bench/results/gpu_check_local}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
LOG="$OUT/gpu_check.log"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
log() { echo "[gpu_check.sh +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }

log "start on $(hostname); python: $($PY -c 'import sys; print(sys.executable, sys.version.split()[0])')"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader 2>&1 | tee -a "$LOG"

# -- 1. dependencies missing from the image, from carried wheels ---------------------------------
if ! $PY -c "import jsonschema" 2>/dev/null; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        log "installing carried wheels from .whl/ into /tmp/site"
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            2>&1 | tee -a "$LOG"
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    else
        log "WARNING: jsonschema is missing and no .whl/ was carried; the hardware DB cannot load"
    fi
fi

# -- local packages: editable install, else a site dir with copies and hand-written metadata ------
SMOKE=${GPU_CHECK_SMOKE:-0}
installed() {
    $PY -c "import importlib.metadata as m, moe_hal, moe_hal_cuda
assert any(e.name == 'cuda' for e in m.entry_points(group='moe_hal.backends'))" 2>/dev/null
}
if installed; then
    log "moe_hal and moe_hal_cuda are already installed here"
elif $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . -e backends/cuda >>"$LOG" 2>&1; then
    log "installed moe-hal and moe-hal-cuda (editable)"
else
    log "editable install failed; building a site dir by copying (see log above)"
    SITE=/tmp/moe_hal_site
    rm -rf "$SITE" && mkdir -p "$SITE/moe_hal/data"
    cp -r moe_hal/. "$SITE/moe_hal/"
    cp -r hwdb "$SITE/moe_hal/data/hwdb"
    [ -d conformance ] && cp -r conformance "$SITE/moe_hal/data/conformance"
    cp -r backends/cuda/moe_hal_cuda "$SITE/moe_hal_cuda"
    for dist in moe_hal moe_hal_cuda; do
        mkdir -p "$SITE/$dist-0.1.0.dist-info"
        printf 'Metadata-Version: 2.1\nName: %s\nVersion: 0.1.0\n' "${dist//_/-}" >"$SITE/$dist-0.1.0.dist-info/METADATA"
    done
    printf '[moe_hal.backends]\ncuda = moe_hal_cuda.plugin\n' >"$SITE/moe_hal_cuda-0.1.0.dist-info/entry_points.txt"
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -c "import moe_hal, moe_hal_cuda; print('moe_hal', moe_hal.__version__, 'backends', [s.name for s in moe_hal.backends()])" \
    2>&1 | tee -a "$LOG"

# -- 2. hardware calibration (owned by the hwdb work; optional) ------------------------------------
OVERLAY="$OUT/measured_overlay.yaml"
if [ -f bench/calibrate.py ]; then
    log "calibrate.py (budget 75 s)"
    CAL_ARGS=()
    [ "$SMOKE" = 1 ] && CAL_ARGS=(--device cpu --sizes 256 --bytes 5e7 --repeat 3)
    timeout 75 $PY bench/calibrate.py --out "$OVERLAY" "${CAL_ARGS[@]}" 2>&1 | tee -a "$LOG" \
        || log "calibrate.py ended with status $?"
else
    log "bench/calibrate.py not present: skipped"
fi
if [ -s "$OVERLAY" ]; then
    export MOE_HAL_HWDB="$OVERLAY"
    log "using the calibration overlay for the model"
fi

# -- 3. the CUDA backend check -------------------------------------------------------------------
log "gpu_check.py (budget 320 s, hard limit 350 s; the JSON is rewritten after every case)"
CHECK_ARGS=()
[ "$SMOKE" = 1 ] && CHECK_ARGS=(--cpu-smoke)
timeout 350 $PY backends/cuda/scripts/gpu_check.py --out "$OUT/gpu_check.json" --budget 320 "${CHECK_ARGS[@]}" 2>&1 | tee -a "$LOG"
CHECK_STATUS=${PIPESTATUS[0]}
log "gpu_check.py ended with status $CHECK_STATUS"

nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee -a "$LOG"
log "done; files in $OUT:"
ls -la "$OUT" | tee -a "$LOG"
# A failed correctness check (or a crashed/killed gpu_check.py) fails the whole call.
exit "$CHECK_STATUS"
