"""Tests of the hardware database (moe_hal/hwdb/, hwdb/*.yaml, hwdb/schema.json).

Expected figures are computed here by hand from the cited sources (e.g. NVIDIA's sparse figure / 2),
never read back from the code under test.
"""

from __future__ import annotations

import copy
import importlib.resources
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import moe_hal
from moe_hal import hwdb, match_device, plugins
from moe_hal.errors import ArgumentError, HardwareDBError

REQUIRED_IDS = {
    "nvidia-h100-sxm",
    "nvidia-h100-pcie",
    "nvidia-h800-sxm",
    "nvidia-h200-sxm",
    "nvidia-h20",
    "nvidia-b200",
    "nvidia-gb200-nvl72",
    "nvidia-b300",
    "nvidia-rtx-4090",
    "nvidia-rtx-5090",
    "nvidia-a100-sxm-80gb",
    "nvidia-l40s",
    "huawei-ascend-910b2",
    "huawei-ascend-910b3",
    "huawei-ascend-910b4",
    "huawei-ascend-910c",
    "huawei-ascend-950pr",
    "huawei-ascend-950dt",
    "cpu-generic",
}

# The feature vocabulary documented in docs/hwdb.md.
KNOWN_FEATURES = {
    "tensor_cores",
    "bf16",
    "fp8",
    "fp4",
    "tma",
    "wgmma",
    "tcgen05",
    "ue8m0_scales",
    "tmem",
    "nvlink",
    "cube_unit",
    "npu_grouped_matmul",
    "nz_format",
    "mx_scales",
    "hif8",
    "ascend_a2",
    "ascend_a3",
    "ascend_a5",
    "cpu",
}


@pytest.fixture(autouse=True)
def clean_db(monkeypatch):
    # The built-in database alone: no plugin overlays (tests/test_plugins.py covers those).
    monkeypatch.delenv("MOE_HAL_HWDB", raising=False)
    monkeypatch.setenv("MOE_HAL_PLUGINS", "")
    plugins.reload()
    yield
    monkeypatch.undo()
    plugins.reload()  # forgets our overlays and lets the plugin host register its own again


def q(value, unit, basis="secondary", source="test source", **extra):
    return {"value": value, "unit": unit, "basis": basis, "source": source, **extra}


def minimal_entry(entry_id: str = "acme-x1", **recognition) -> dict:
    """A small valid entry; tests break one field at a time."""
    return {
        "schema_version": 1,
        "id": entry_id,
        "vendor": "acme",
        "name": "ACME X1",
        "architecture": "acme_arch",
        "aliases": [],
        "features": ["tensor_cores", "bf16"],
        "recognition": recognition or {"cuda": {"name_pattern": r"\bACME X1\b", "compute_capability": "9.9"}},
        "compute": {"unit_kind": "sm", "units": q(100, "count")},
        "peak_dense": {"bf16": q(500, "TFLOPS"), "int8": q(1000, "TOPS")},
        "memory": {"bandwidth": q(2, "TB/s")},
    }


def write(directory: Path, name: str, doc) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def load_with(monkeypatch, *paths: Path) -> None:
    monkeypatch.setenv("MOE_HAL_HWDB", os.pathsep.join(str(p) for p in paths))
    hwdb.reload()
    hwdb.all()


# ---------------------------------------------------------------------------------------------
# The shipped entries


def test_every_required_entry_loads_and_validates():
    ids = {e.id for e in hwdb.all()}
    assert REQUIRED_IDS <= ids
    assert [e.id for e in hwdb.all()] == sorted(ids)


def test_entries_are_read_through_importlib_resources_and_named_by_id():
    root = Path(str(importlib.resources.files("moe_hal.data.hwdb")))
    for entry in hwdb.all():
        path = Path(entry.path)
        assert path.parent == root, entry.path
        assert path.name == f"{entry.id}.yaml"


def test_ids_have_the_vendor_model_form():
    for entry in hwdb.all():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", entry.id)
        if entry.vendor != "generic":
            assert entry.id.startswith(entry.vendor + "-")


def test_features_use_the_documented_vocabulary_and_no_arch_lists():
    for entry in hwdb.all():
        assert entry.features <= KNOWN_FEATURES, (entry.id, entry.features - KNOWN_FEATURES)
        assert not any(re.match(r"sm_?\d", f) for f in entry.features)


def test_feature_sets_that_backends_select_on():
    assert {"wgmma", "tma", "fp8"} <= hwdb.get("nvidia-h100-sxm").features
    assert "tcgen05" not in hwdb.get("nvidia-h200-sxm").features
    for b in ("nvidia-b200", "nvidia-gb200-nvl72", "nvidia-b300"):
        assert {"tcgen05", "tmem", "ue8m0_scales", "fp4"} <= hwdb.get(b).features
        assert "wgmma" not in hwdb.get(b).features
    assert not {"tcgen05", "tmem", "wgmma"} & hwdb.get("nvidia-rtx-5090").features
    assert not {"tma", "wgmma", "fp8"} & hwdb.get("nvidia-a100-sxm-80gb").features
    for a2 in ("huawei-ascend-910b2", "huawei-ascend-910b3", "huawei-ascend-910b4"):
        assert {"ascend_a2", "npu_grouped_matmul", "cube_unit"} <= hwdb.get(a2).features
        assert "fp8" not in hwdb.get(a2).features
    assert "ascend_a3" in hwdb.get("huawei-ascend-910c").features
    for a5 in ("huawei-ascend-950pr", "huawei-ascend-950dt"):
        assert {"ascend_a5", "fp8", "mx_scales", "hif8"} <= hwdb.get(a5).features
    assert hwdb.get("cpu-generic").features == {"cpu"}


def test_every_number_has_unit_basis_and_source():
    for entry in hwdb.all():
        seen = 0
        for path, node in entry.quantities():
            seen += 1
            assert node["unit"], (entry.id, path)
            if node["value"] is None:
                assert node["note"], (entry.id, path)
                continue
            assert node["basis"] in {"datasheet", "whitepaper", "secondary", "derived", "measured", "fitted"}
            assert node["source"]
            if node["basis"] == "measured":
                assert node["date"] and node["method"] and node["tool"], (entry.id, path)
            if node["basis"] == "fitted":  # fitted to measurements: say how and over how many cases
                assert node["method"] and node["cases"] >= 1, (entry.id, path)
                assert path.startswith("achieved."), (entry.id, path)
        assert seen >= 1


def test_dense_figures_derived_from_sparse_say_so():
    # A value derived from a "with sparsity" figure must be marked derived and be exactly half.
    checked = 0
    for entry in hwdb.all():
        for path, node in entry.quantities():
            note = node.get("note") or ""
            match = re.search(r"([\d.,]+) (TFLOPS|TOPS|PFLOPS|POPS) with sparsity / 2", note)
            if path.startswith("peak_dense.") and match:
                sparse = float(match.group(1).replace(",", "")) * (1000 if match.group(2)[0] == "P" else 1)
                assert node["basis"] == "derived", (entry.id, path)
                assert node["value"] == pytest.approx(sparse / 2, rel=2e-3), (entry.id, path)
                checked += 1
    assert checked >= 30  # the NVIDIA entries hold this many halved figures


def test_figures_against_the_cited_sources():
    h100 = hwdb.get("nvidia-h100-sxm")
    assert h100.peak_flops("bf16") == pytest.approx(1979e12 / 2)  # datasheet: 1,979 with sparsity
    assert h100.peak_flops("fp8") == pytest.approx(3958e12 / 2)
    assert h100.peak_flops("fp32") == pytest.approx(67e12)
    assert h100.mem_bandwidth() == pytest.approx(3.35e12)
    assert h100.num_cores == 132 and h100.mma_min_m == 64
    assert h100.smem_per_core_bytes == 228 * 1024
    assert hwdb.get("nvidia-h100-pcie").num_cores == 114
    assert hwdb.get("nvidia-a100-sxm-80gb").peak_flops("bf16") == pytest.approx(312e12)  # printed dense
    assert hwdb.get("nvidia-a100-sxm-80gb").peak_flops("int8") == pytest.approx(624e12)
    assert hwdb.get("nvidia-b200").peak_flops("fp4") == pytest.approx(18e15 / 2)
    assert hwdb.get("nvidia-gb200-nvl72").peak_flops("bf16") == pytest.approx(5e15 / 2)
    # Ascend cube: AI cores x 16*16*16 MAC x 2 FLOP x clock.
    assert hwdb.get("huawei-ascend-910b2").peak_flops("bf16") == pytest.approx(24 * 4096 * 2 * 1.8e9, rel=1e-3)
    assert hwdb.get("huawei-ascend-910b4").peak_flops("bf16") == pytest.approx(20 * 4096 * 2 * 1.5e9, rel=1e-3)
    assert hwdb.get("huawei-ascend-910b3").peak_flops("bf16") == pytest.approx(20 * 4096 * 2 * 1.8e9, rel=1e-3)
    assert hwdb.get("huawei-ascend-950pr").peak_flops("bf16") == pytest.approx(28 * 4096 * 2 * 1.65e9, rel=1e-3)
    for soc in ("910b2", "910b3", "910b4"):  # int8 cube fractal 16x32x16: twice the fp16 rate
        entry = hwdb.get(soc)
        assert entry.peak_flops("int8") == pytest.approx(2 * entry.peak_flops("fp16"), rel=1e-3)
    assert hwdb.get("huawei-ascend-910b2").mma_min_m == 16
    assert hwdb.get("huawei-ascend-910b2").l2_bytes == 192 * 2**20
    assert hwdb.get("huawei-ascend-910b2").smem_per_core_bytes is None


def test_cpu_generic_has_no_invented_figures():
    cpu = hwdb.get("cpu-generic")
    assert cpu.num_cores is None
    assert cpu.peak_flops("fp32") is None and cpu.mem_bandwidth() is None
    assert all(node["value"] is None for _, node in cpu.quantities())


def test_h200_measured_values_are_preferred_and_attributed():
    """The entry's third-party measurements, overridden key by key by the committed calibration
    run (hwdb/measured/nvidia-h200-sxm.yaml, bench/calibrate.py on an H200)."""
    overlay = Path(__file__).resolve().parents[1] / "hwdb" / "measured" / "nvidia-h200-sxm.yaml"
    run = yaml.safe_load(overlay.read_text())["measured"]
    h200 = hwdb.get("h200")
    assert h200.peak_flops("bf16") == pytest.approx(run["matmul"]["bf16"]["value"] * 1e12)
    assert h200.peak_flops("fp8") == pytest.approx(run["matmul"]["fp8"]["value"] * 1e12)
    assert h200.peak_flops("bf16", measured=False) == pytest.approx(1979e12 / 2)
    assert h200.peak_flops("fp8", measured=False) == pytest.approx(3958e12 / 2)
    copy_bw = h200.quantity("measured.copy_bandwidth")
    assert copy_bw.si == pytest.approx(run["copy_bandwidth"]["value"] * 1e9) and copy_bw.basis == "measured"
    assert copy_bw.source.startswith("bench/calibrate.py") and copy_bw.date == run["copy_bandwidth"]["date"]
    assert h200.mem_bandwidth() == pytest.approx(run["read_bandwidth"]["value"] * 1e9)  # measured read
    assert h200.mem_bandwidth(measured=False) == pytest.approx(4.8e12)


# ---------------------------------------------------------------------------------------------
# get / quantity / peak_flops


def test_get_by_id_alias_and_case():
    assert hwdb.get("nvidia-h200-sxm") is hwdb.get("h200") is hwdb.get(" H200 ")
    assert hwdb.get("910b2").id == "huawei-ascend-910b2"
    assert hwdb.get("b200").id == "nvidia-b200"
    assert hwdb.get("cpu").id == "cpu-generic"


def test_get_unknown_names_the_known_ids():
    with pytest.raises(ArgumentError) as info:
        hwdb.get("nvidia-h900")
    assert info.value.argument == "hw"
    assert "nvidia-h200-sxm" in str(info.value.expected) and "nvidia-h900" in str(info.value)


def test_peak_flops_dtype_spellings_and_errors():
    h100 = hwdb.get("nvidia-h100-sxm")
    assert h100.peak_flops("fp8_e4m3") == h100.peak_flops("fp8")
    assert h100.peak_flops(torch.bfloat16) == h100.peak_flops("bf16")
    assert h100.peak_flops("float16") == h100.peak_flops("fp16")
    assert h100.peak_flops("fp4") is None  # Hopper has no fp4 tensor rate
    with pytest.raises(ArgumentError):
        h100.peak_flops("fp64")


def test_quantity_paths():
    h100 = hwdb.get("nvidia-h100-sxm")
    bw = h100.quantity("memory.bandwidth")
    assert (bw.value, bw.unit, bw.basis) == (3.35, "TB/s", "datasheet")
    assert bw.si == pytest.approx(3.35e12)
    assert h100.quantity("measured.read_bandwidth") is None
    assert h100.quantity("peak_dense.fp4") is None
    assert hwdb.get("huawei-ascend-910b3").quantity("on_chip.l2") is None  # value: null with a note
    with pytest.raises(ArgumentError):
        h100.quantity("memory")  # a section, not a quantity
    with pytest.raises(ArgumentError):
        h100.quantity("memory.bandwidth.value")


def test_unit_conversions():
    assert hwdb.Quantity(1.5, "GiB", "derived", "s").si == 1.5 * 2**30
    assert hwdb.Quantity(50, "MB", "derived", "s").si == 50e6
    assert hwdb.Quantity(2, "PFLOPS", "derived", "s").si == 2e15
    assert hwdb.Quantity(864, "GB/s", "derived", "s").si == 864e9
    assert hwdb.Quantity(1.65, "GHz", "derived", "s").si == pytest.approx(1.65e9)
    assert hwdb.get("huawei-ascend-910b2").quantity("memory.capacity").si == 68719476736


# ---------------------------------------------------------------------------------------------
# Matching on faked device properties


@pytest.mark.parametrize(
    "name, cc, sms, expected",
    [
        ("NVIDIA H100 80GB HBM3", (9, 0), 132, "nvidia-h100-sxm"),
        ("NVIDIA H100 PCIe", (9, 0), 114, "nvidia-h100-pcie"),
        ("NVIDIA H200", (9, 0), 132, "nvidia-h200-sxm"),
        ("NVIDIA H200", (9, 0), None, "nvidia-h200-sxm"),
        ("NVIDIA H800", (9, 0), 132, "nvidia-h800-sxm"),
        ("NVIDIA H20", (9, 0), 78, "nvidia-h20"),
        ("NVIDIA B200", (10, 0), 148, "nvidia-b200"),
        ("NVIDIA GB200", (10, 0), 148, "nvidia-gb200-nvl72"),
        ("NVIDIA A100-SXM4-80GB", (8, 0), 108, "nvidia-a100-sxm-80gb"),
        ("NVIDIA L40S", (8, 9), 142, "nvidia-l40s"),
        ("NVIDIA GeForce RTX 4090", (8, 9), 128, "nvidia-rtx-4090"),
        ("NVIDIA GeForce RTX 5090", (12, 0), 170, "nvidia-rtx-5090"),
    ],
)
def test_match_cuda(name, cc, sms, expected):
    m = hwdb.match_cuda(name, *cc, sms)
    assert m.id == expected, m.reason
    assert m.reason is None and m.entry is hwdb.get(expected)
    assert name in m.seen and f"cc {cc[0]}.{cc[1]}" in m.seen
    assert m.features == hwdb.get(expected).features


@pytest.mark.parametrize(
    "name, cc, sms, why",
    [
        ("NVIDIA H100 PCIe", (9, 0), 132, "114 SMs, not 132"),  # wrong board for its SM count
        ("NVIDIA H200 MIG 1g.18gb", (9, 0), 16, "no hardware-DB entry"),  # a MIG slice is not the GPU
        ("NVIDIA H200", (9, 0), 16, "132 SMs, not 16"),
        ("NVIDIA H200 NVL", (9, 0), 132, "no hardware-DB entry"),  # a different board, no entry
        ("NVIDIA B200", (9, 0), 148, "compute capability 10.0, not 9.0"),
        ("NVIDIA A100-SXM4-40GB", (8, 0), 108, "no hardware-DB entry"),  # other memory, no entry
        ("Tesla T4", (7, 5), 40, "no hardware-DB entry"),
    ],
)
def test_match_cuda_never_returns_a_wrong_entry(name, cc, sms, why):
    m = hwdb.match_cuda(name, *cc, sms)
    assert m.entry is None and m.id is None and m.features == frozenset()
    assert name in m.seen
    assert why in m.reason


@pytest.mark.parametrize(
    "soc, version, expected",
    [
        ("Ascend910B2", 221, "huawei-ascend-910b2"),
        ("Ascend910B3", 223, "huawei-ascend-910b3"),
        ("Ascend910B4", 224, "huawei-ascend-910b4"),
        ("Ascend910B4", None, "huawei-ascend-910b4"),
        ("Ascend910_9391", 250, "huawei-ascend-910c"),
        ("Ascend910_9362", 255, "huawei-ascend-910c"),
        ("Ascend950PR_9579", 260, "huawei-ascend-950pr"),
        ("Ascend950PR_957b", 260, "huawei-ascend-950pr"),
        ("Ascend950DT_95A1", 260, "huawei-ascend-950dt"),
    ],
)
def test_match_npu(soc, version, expected):
    m = hwdb.match_npu(soc, version)
    assert m.id == expected, m.reason
    assert soc in m.seen


@pytest.mark.parametrize(
    "soc, version, why",
    [
        ("Ascend910B2", 224, "expects soc_version in [221], not 224"),
        ("Ascend910B2C", 221, "expects soc_version in [222], not 221"),  # B2C is its own SoC, not the B2
        ("Ascend910B4_1", 224, "expects soc_version in [225], not 224"),  # nor is the 64 GB B4 the B4
        ("Ascend310P3", 202, "no hardware-DB entry"),
    ],
)
def test_match_npu_unknown(soc, version, why):
    m = hwdb.match_npu(soc, version)
    assert m.entry is None and why in m.reason and soc in m.seen


def test_match_cpu():
    for device in ("cpu", torch.device("cpu")):
        m = match_device(device)
        assert m.id == "cpu-generic" and m.features == {"cpu"}
        assert f"({os.cpu_count()} logical CPUs)" in m.seen
    m = hwdb.match_cpu("AMD EPYC 9654 96-Core Processor", 192)
    assert m.id == "cpu-generic" and m.seen == "AMD EPYC 9654 96-Core Processor (192 logical CPUs)"


def test_match_other_device_types_never_raise():
    m = match_device(torch.device("meta"))
    assert m.entry is None and "meta" in m.reason
    assert match_device("mps").entry is None
    if not torch.cuda.is_available():
        m = match_device(torch.device("cuda", 0))
        assert m.entry is None and m.seen == "cuda:0" and m.reason


def test_ambiguous_match_names_both_entries(tmp_path, monkeypatch):
    clone = minimal_entry("acme-h200-clone", cuda={"name_pattern": r"\bH200\b", "compute_capability": "9.0"})
    load_with(monkeypatch, write(tmp_path, "clone.yaml", clone))
    m = hwdb.match_cuda("NVIDIA H200", 9, 0, 132)
    assert m.entry is None
    assert "ambiguous" in m.reason and "nvidia-h200-sxm" in m.reason and "acme-h200-clone" in m.reason


def test_specific_cpu_entry_wins_over_generic(tmp_path, monkeypatch):
    epyc = minimal_entry("amd-epyc-9654", cpu={"model_pattern": "EPYC 9654"})
    epyc["compute"]["unit_kind"] = "cpu_core"
    load_with(monkeypatch, write(tmp_path, "epyc.yaml", epyc))
    assert hwdb.match_cpu("AMD EPYC 9654 96-Core Processor", 192).id == "amd-epyc-9654"
    assert hwdb.match_cpu("Intel Xeon", 8).id == "cpu-generic"


# ---------------------------------------------------------------------------------------------
# Overlays


def test_overlay_entry_via_env(tmp_path, monkeypatch):
    load_with(
        monkeypatch,
        write(tmp_path / "a", "x1.yaml", minimal_entry()),
        write(
            tmp_path / "b",
            "x2.yaml",
            minimal_entry("acme-x2", cuda={"name_pattern": "X2", "compute_capability": "9.9"}),
        ),
    )
    assert hwdb.get("acme-x1").peak_flops("bf16") == 500e12
    assert hwdb.get("acme-x1").peak_flops("int8") == 1000e12
    assert hwdb.match_cuda("ACME X1", 9, 9, 100).id == "acme-x1"
    assert hwdb.get("acme-x2").path.endswith("x2.yaml [MOE_HAL_HWDB]")
    ids = [e.id for e in hwdb.all()]
    assert ids == sorted(ids) and {"acme-x1", "acme-x2"} <= set(ids)


def test_env_change_is_picked_up_and_reload_drops_it(tmp_path, monkeypatch):
    directory = tmp_path / "db"
    write(directory, "x1.yaml", minimal_entry())
    assert "acme-x1" not in {e.id for e in hwdb.all()}
    monkeypatch.setenv("MOE_HAL_HWDB", str(directory))
    assert hwdb.get("acme-x1")
    monkeypatch.delenv("MOE_HAL_HWDB")
    with pytest.raises(ArgumentError):
        hwdb.get("acme-x1")


def test_the_mma_rate_per_core_cycle_follows_a_reloaded_database(tmp_path, monkeypatch):
    # the efficiency table converts shares lent within an architecture at this rate and keeps it
    # per entry: a database re-read with another clock must not answer from before
    from moe_hal.perf.efficiency import hwdb_mma_rate

    entry = minimal_entry()
    entry["compute"]["boost_clock"] = q(2.0, "GHz")
    load_with(monkeypatch, write(tmp_path / "a", "x1.yaml", entry))
    assert hwdb_mma_rate("acme-x1", "bf16") == pytest.approx(500e12 / (100 * 2.0e9))
    entry["compute"]["boost_clock"] = q(1.0, "GHz")
    load_with(monkeypatch, write(tmp_path / "b", "x1.yaml", entry))
    assert hwdb_mma_rate("acme-x1", "bf16") == pytest.approx(500e12 / (100 * 1.0e9))
    del entry["compute"]["boost_clock"]
    load_with(monkeypatch, write(tmp_path / "c", "x1.yaml", entry))
    assert hwdb_mma_rate("acme-x1", "bf16") is None


def test_every_nvidia_gpu_but_the_b300_has_the_mma_rate_a_lent_share_is_converted_at():
    # docs/perf-model.md ("Achieved efficiency", fallback step 2): a device without a boost clock is
    # never converted, and the B300 is the one NVIDIA GPU the hardware DB has none for; the H20
    # must have one, or the H100s' cuBLAS shares it borrows held out stay unconverted (zzc #77)
    from moe_hal.perf.efficiency import hwdb_mma_rate

    gpus = [e.id for e in hwdb.all() if e.vendor == "nvidia" and e.peak_flops("bf16", measured=False)]
    missing = [gpu for gpu in gpus if hwdb_mma_rate(gpu, "bf16") is None]
    assert missing == ["nvidia-b300"]
    assert hwdb_mma_rate("nvidia-h100-sxm", "bf16") > 3 * hwdb_mma_rate("nvidia-h20", "bf16")


def test_add_overlay_from_a_plugin(tmp_path):
    path = write(tmp_path, "x1.yaml", minimal_entry())
    hwdb.add_overlay(path, "acme_plugin")
    entry = hwdb.get("acme-x1")
    assert "plugin acme_plugin" in entry.path
    hwdb.reload()
    assert hwdb.get("acme-x1")  # registered overlays survive a cache reload
    hwdb.reload(forget_overlays=True)
    with pytest.raises(ArgumentError):
        hwdb.get("acme-x1")


def test_add_overlay_rejects_a_bad_file_and_keeps_the_database(tmp_path):
    bad = minimal_entry()
    del bad["peak_dense"]["bf16"]["basis"]
    with pytest.raises(HardwareDBError) as info:
        hwdb.add_overlay(write(tmp_path, "bad.yaml", bad), "acme_plugin")
    assert "plugin acme_plugin" in info.value.file and info.value.path == "peak_dense.bf16.basis"
    assert hwdb.get("h200")  # the bad overlay was not kept


def test_measured_overlay_adds_values_to_an_existing_entry(tmp_path, monkeypatch):
    overlay = {
        "schema_version": 1,
        "overlay_of": "nvidia-h100-sxm",
        "measured": {
            "matmul": {"bf16": q(700, "TFLOPS", "measured", date="2026-11-01", method="m", tool="t", shape=[8192] * 3)},
            "read_bandwidth": q(3000, "GB/s", "measured", date="2026-11-01", method="sum", tool="t"),
        },
    }
    path = write(tmp_path, "h100.yaml", overlay)
    load_with(monkeypatch, path)
    h100 = hwdb.get("h100")
    assert h100.peak_flops("bf16") == 700e12
    assert h100.peak_flops("bf16", measured=False) == pytest.approx(989.5e12)
    assert h100.mem_bandwidth() == 3000e9 and h100.mem_bandwidth(measured=False) == 3.35e12
    assert h100.measured_paths[-1] == f"{path} [MOE_HAL_HWDB]"  # after the committed overlays of hwdb/measured
    assert h100.path.endswith("nvidia-h100-sxm.yaml")


def test_measured_overlay_replaces_per_key(tmp_path, monkeypatch):
    overlay = {
        "schema_version": 1,
        "overlay_of": "nvidia-h200-sxm",
        "measured": {"matmul": {"bf16": q(800, "TFLOPS", "measured", date="2026-11-01", method="m", tool="t")}},
    }
    kept = hwdb.get("h200").quantity("measured.copy_bandwidth")
    load_with(monkeypatch, write(tmp_path, "h200.yaml", overlay))
    h200 = hwdb.get("h200")
    assert h200.peak_flops("bf16") == 800e12  # the newer measurement wins
    assert h200.quantity("measured.copy_bandwidth") == kept  # the rest is kept


def test_hwdb_validate(tmp_path):
    hwdb.validate(write(tmp_path, "ok.yaml", minimal_entry()))
    bad = minimal_entry()
    bad["peak_dense"]["bf16"]["unit"] = "TB/s"
    with pytest.raises(HardwareDBError):
        hwdb.validate(write(tmp_path, "bad.yaml", bad))
    assert "acme-x1" not in {e.id for e in hwdb.all()}  # validate registers nothing


# ---------------------------------------------------------------------------------------------
# Malformed input: a HardwareDBError naming the file and the field


def broken(mutate) -> dict:
    doc = copy.deepcopy(minimal_entry())
    mutate(doc)
    return doc


def _measured_without(field):
    def mutate(doc):
        measured = q(450, "TFLOPS", "measured", date="2026-11-01", method="torch.matmul", tool="torch")
        del measured[field]
        doc["peak_dense"]["bf16"] = measured

    return mutate


MALFORMED = [
    ("unknown top-level key", lambda d: d.update(colour="green"), "colour"),
    ("unknown key in a quantity", lambda d: d["peak_dense"]["bf16"].update(sparse=True), "peak_dense.bf16.sparse"),
    ("unknown dtype", lambda d: d["peak_dense"].update(fp64=q(1, "TFLOPS")), "peak_dense.fp64"),
    ("wrong type", lambda d: d["peak_dense"]["bf16"].update(value="fast"), "peak_dense.bf16.value"),
    ("count not an integer", lambda d: d["compute"]["units"].update(value=1.5), "compute.units.value"),
    ("negative rate", lambda d: d["peak_dense"]["bf16"].update(value=-1), "peak_dense.bf16.value"),
    ("missing basis", lambda d: d["peak_dense"]["bf16"].pop("basis"), "peak_dense.bf16.basis"),
    ("missing source", lambda d: d["memory"]["bandwidth"].pop("source"), "memory.bandwidth.source"),
    ("unknown basis", lambda d: d["peak_dense"]["bf16"].update(basis="rumour"), "peak_dense.bf16.basis"),
    ("bandwidth unit on a rate", lambda d: d["peak_dense"]["bf16"].update(unit="TB/s"), "peak_dense.bf16.unit"),
    ("FLOPS unit on int8", lambda d: d["peak_dense"]["int8"].update(unit="TFLOPS"), "peak_dense.int8.unit"),
    ("rate unit on a bandwidth", lambda d: d["memory"]["bandwidth"].update(unit="TFLOPS"), "memory.bandwidth.unit"),
    ("missing unit", lambda d: d["memory"]["bandwidth"].pop("unit"), "memory.bandwidth.unit"),
    ("measured without date", _measured_without("date"), "peak_dense.bf16.date"),
    ("measured without method", _measured_without("method"), "peak_dense.bf16.method"),
    ("measured without tool", _measured_without("tool"), "peak_dense.bf16.tool"),
    (
        "unknown value without a note",
        lambda d: d["memory"].update(bandwidth={"value": None, "unit": "TB/s"}),
        "memory.bandwidth.note",
    ),
    ("missing required section", lambda d: d.pop("compute"), "compute"),
    ("bad id", lambda d: d.update(id="ACME X1"), "id"),
    ("arch-list feature", lambda d: d["features"].append("sm90"), "features.2"),
    (
        "bad compute capability",
        lambda d: d["recognition"]["cuda"].update(compute_capability="9"),
        "recognition.cuda.compute_capability",
    ),
    ("bad regex", lambda d: d["recognition"]["cuda"].update(name_pattern="H200("), "recognition.cuda.name_pattern"),
    (
        "SM check without a count",
        lambda d: (
            d["recognition"]["cuda"].update(require_sm_count=True),
            d["compute"].update(units={"value": None, "unit": "count", "note": "n"}),
        ),
        "recognition.cuda.require_sm_count",
    ),
]


@pytest.mark.parametrize("case, mutate, field", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_entry(case, mutate, field, tmp_path, monkeypatch):
    path = write(tmp_path, "bad.yaml", broken(mutate))
    with pytest.raises(HardwareDBError) as info:
        load_with(monkeypatch, path)
    assert info.value.path == field, info.value
    assert str(path) in info.value.file and str(path) in str(info.value)


def test_malformed_measured_overlay(tmp_path, monkeypatch):
    value = q(700, "TFLOPS", "measured", date="2026-11-01", method="m", tool="t")
    cases = {
        "measured.matmul.bf16.tool": {k: v for k, v in value.items() if k != "tool"},
        "measured.matmul.bf16.basis": {**value, "basis": "datasheet"},
        "measured.matmul.bf16.colour": {**value, "colour": 1},
    }
    for field, node in cases.items():
        path = write(
            tmp_path,
            "m.yaml",
            {"schema_version": 1, "overlay_of": "nvidia-h100-sxm", "measured": {"matmul": {"bf16": node}}},
        )
        with pytest.raises(HardwareDBError) as info:
            load_with(monkeypatch, path)
        assert info.value.path == field and str(path) in info.value.file
    path = write(
        tmp_path, "m.yaml", {"schema_version": 1, "overlay_of": "nvidia-h999", "measured": {"matmul": {"bf16": value}}}
    )
    with pytest.raises(HardwareDBError) as info:
        load_with(monkeypatch, path)
    assert info.value.path == "overlay_of" and "nvidia-h999" in info.value.message


def test_bad_yaml_syntax(tmp_path, monkeypatch):
    path = write(tmp_path, "bad.yaml", "id: acme-x1\npeak_dense: {bf16: [1, 2\n")
    with pytest.raises(HardwareDBError) as info:
        load_with(monkeypatch, path)
    assert str(path) in info.value.file and "malformed YAML" in info.value.message
    assert re.search(r"line \d+", info.value.message)


def test_only_safe_yaml_is_accepted(tmp_path, monkeypatch):
    path = write(tmp_path, "evil.yaml", "!!python/object/apply:os.system ['true']\n")
    with pytest.raises(HardwareDBError) as info:
        load_with(monkeypatch, path)
    assert "malformed YAML" in info.value.message


def test_top_level_must_be_a_mapping(tmp_path, monkeypatch):
    with pytest.raises(HardwareDBError) as info:
        load_with(monkeypatch, write(tmp_path, "list.yaml", "- a\n- b\n"))
    assert "mapping" in info.value.message and info.value.path == ""


def test_unquoted_yaml_date_is_accepted(tmp_path, monkeypatch):
    text = yaml.safe_dump(minimal_entry(), sort_keys=False)
    text += "measured:\n  read_bandwidth: {value: 1.5, unit: TB/s, basis: measured, source: s, date: 2026-11-01, method: m, tool: t}\n"
    load_with(monkeypatch, write(tmp_path, "x1.yaml", text))
    assert hwdb.get("acme-x1").quantity("measured.read_bandwidth").date == "2026-11-01"


def test_duplicate_id_across_overlay_and_base_names_both_files(tmp_path, monkeypatch):
    dup = minimal_entry("nvidia-h200-sxm")
    path = write(tmp_path, "dup.yaml", dup)
    with pytest.raises(HardwareDBError) as info:
        load_with(monkeypatch, path)
    text = str(info.value)
    assert str(path) in text and "nvidia-h200-sxm.yaml" in text and info.value.path == "id"


def test_duplicate_id_between_two_overlays_names_both_files(tmp_path, monkeypatch):
    first = write(tmp_path / "a", "one.yaml", minimal_entry())
    second = write(tmp_path / "b", "two.yaml", minimal_entry())
    with pytest.raises(HardwareDBError) as info:
        load_with(monkeypatch, first, second)
    assert str(first) in str(info.value) and str(second) in str(info.value)


def test_duplicate_alias_names_both_files(tmp_path, monkeypatch):
    doc = minimal_entry()
    doc["aliases"] = ["h200"]
    path = write(tmp_path, "x1.yaml", doc)
    with pytest.raises(HardwareDBError) as info:
        load_with(monkeypatch, path)
    assert info.value.path == "aliases.0" and "nvidia-h200-sxm.yaml" in str(info.value) and str(path) in str(info.value)


def test_missing_overlay_path(tmp_path, monkeypatch):
    with pytest.raises(HardwareDBError) as info:
        load_with(monkeypatch, tmp_path / "nowhere")
    assert "nowhere" in info.value.file and "no such file" in info.value.message


def test_import_reads_nothing():
    code = (
        "import moe_hal.hwdb as h, moe_hal.hwdb.loading as loading, sys; "
        "assert loading._cache['db'] is None and loading._schema_validator is None; "
        "assert 'torch_npu' not in sys.modules and 'cuda' not in sys.modules; "
        "assert 'moe_hal.plugins' not in sys.modules; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_look_ups_and_estimates_never_load_plugins():
    # The database is pure data: reading it (and the performance model reading it) must neither
    # discover plugins nor print their warnings, even with broken plugins installed.
    code = (
        "import sys, moe_hal.hwdb as h, moe_hal.perf as perf; "
        "h.all(); h.get('nvidia-h200-sxm'); h.match_cpu('Intel Xeon', 8); "
        "perf.estimate([64, 0, 128], n=256, k=512, hw='nvidia-h200-sxm'); "
        "assert 'moe_hal.plugins' not in sys.modules and 'pluggy' not in sys.modules, 'plugins loaded'; "
        "print('ok')"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MOE_HAL_PLUGINS", "MOE_HAL_HWDB")}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok" and result.stderr == ""


def test_a_plugin_alone_adds_a_device_type(tmp_path, monkeypatch):
    # A vendor with a new device type ships its entry (a recognition block of its own kind) and
    # a probe; the core knows nothing of it.
    entry = minimal_entry("acme-tpu-1", acme_tpu={"part_number": "ATPU-1"})
    entry["compute"]["unit_kind"] = "core"
    overlay = write(tmp_path, "acme.yaml", entry)

    class AcmePlugin:
        @staticmethod
        @moe_hal.hookimpl
        def moe_hal_hardware_db(register):
            register(overlay)

        @staticmethod
        @moe_hal.hookimpl
        def moe_hal_probe_device(device_type, index):
            if device_type != "acme_tpu":
                return None
            seen = "ATPU-1"  # what the vendor's runtime would report for device `index`
            candidates = [e for e in hwdb.all() if e.raw["recognition"].get("acme_tpu", {}).get("part_number") == seen]
            return hwdb.decide(candidates, seen, [], "ACME TPU")

    host = plugins.host().ensure_loaded()
    host.pm.register(AcmePlugin, name="acme")
    host.plugins["acme"] = plugins.PluginRecord("acme", "test")
    host._register_hw_overlays()
    m = match_device("acme_tpu:0")
    assert m.id == "acme-tpu-1" and m.seen == "ATPU-1"
    assert match_device("other_tpu:0").entry is None
