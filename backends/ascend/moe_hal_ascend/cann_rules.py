"""The host-side rules CANN applies to the calls the Ascend backends make, each with its source.

The CPU emulator (:mod:`moe_hal_ascend.emulator`) enforces exactly these rules and names the rule
and its source in every rejection; the recorded-call replay (:mod:`moe_hal_ascend.replay`) checks
recorded calls against the same functions. ``docs/ascend-backend.md`` lists the table (a test keeps
the two in step). A rule is only here if a source states it; what no source confirms is listed
in the docs as an assumption instead.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The sources, pinned to the commit that was read.
OPS_TRANSFORMER_ACLNN = (
    "hicann/ops-transformer@c29bc1069d3252c641e2aa059ec88f392d3f05ac "
    "gmm/grouped_matmul/op_host/op_api/aclnn_grouped_matmul.cpp"
)
OPS_TRANSFORMER_UTIL = (
    "hicann/ops-transformer@c29bc1069d3252c641e2aa059ec88f392d3f05ac "
    "gmm/grouped_matmul/op_host/op_api/aclnn_grouped_matmul_util.cpp (IsTransposeLastTwoDims)"
)
OPS_TRANSFORMER_950 = (
    "yuanfang-chen/ops-transformer@026f96698a73b7f4a6c2572f375662afe77f0c56 "
    "gmm/grouped_matmul/op_host/op_api/aclnn_grouped_matmul_910_95_checker.cpp"
)
WEIGHT_NZ_DOC = (
    "hicann/ops-transformer@c08953c5049f174a9db26e9f65d9d78b79991de9 "
    "gmm/grouped_matmul/docs/aclnnGroupedMatmulWeightNz.md"
)
V5_DOC = (
    "hicann/ops-transformer@c08953c5049f174a9db26e9f65d9d78b79991de9 gmm/grouped_matmul/docs/aclnnGroupedMatmulV5.md"
)
TORCH_NPU_META = "torch_npu 2.13.0 wheel, torch_npu/op_plugin/meta/_meta_registrations.py (npu_grouped_matmul_meta)"
CAST_DOC = "hicann/ops-math@a27d2419b011aaf2fc98cc63621c2c29e3b56889 math/cast/docs/aclnnCast.md"
INDEX_SELECT_DOC = "hicann/ops-nn@38220c59b60989acbc24d1cfba1e56231a3aac2a index/gather_v2/docs/aclnnIndexSelect.md"


@dataclass(frozen=True)
class Rule:
    """One host-side check: a stable id, what it requires, and where that is stated."""

    id: str
    requires: str
    source: str


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "group_type",
            "group_type is -1, 0 or 2; 1 (split N) is refused",
            f"{OPS_TRANSFORMER_ACLNN} (PreCheckGroupType); {TORCH_NPU_META}",
        ),
        Rule(
            "split_item_no_split",
            "group_type -1 takes split_item 0/1 only",
            f"{OPS_TRANSFORMER_ACLNN} (PreCheckGroupType, CheckCaseNoSplit)",
        ),
        Rule(
            "split_item_single_weight",
            "group_type 0 with a single x and a single 3-D weight takes split_item 2/3 only "
            "(split_item 0/1 asks for a y list the single-weight case does not support)",
            f"{OPS_TRANSFORMER_ACLNN} (SplitMSingleXSingleWeightSingleY, CheckCaseSplitM); {TORCH_NPU_META}",
        ),
        Rule(
            "split_item_split_k",
            "group_type 2 takes a single x, a single 2-D weight and a single 3-D y: split_item 2/3 "
            "(0/1 make y a 2-D list)",
            f"{OPS_TRANSFORMER_ACLNN} (CheckCaseSplitK); {TORCH_NPU_META}",
        ),
        Rule(
            "dims",
            "group_type 0: x 2-D, single weight 3-D [E, K, N]; group_type 2: x 2-D, weight 2-D",
            f"{OPS_TRANSFORMER_ACLNN} (CheckDimNumAndFormat)",
        ),
        Rule(
            "transpose_rule",
            "a tensor is 'transposed' iff stride[-2] == 1, stride[-1] == shape[-2] and every batch "
            "stride equals the product of the dims after it (size-1 dims included)",
            OPS_TRANSFORMER_UTIL,
        ),
        Rule(
            "x_not_transposed",
            "group_type 0/-1: x must not be transposed (unless its last two dims are 1 x 1)",
            f"{OPS_TRANSFORMER_ACLNN} (CheckTransposeStatus, CheckSpecialTranspose, CheckParamDifferentGroupType)",
        ),
        Rule(
            "split_k_transposes",
            "group_type 2: x must be transposed and the weight must not be "
            "(a weight whose last two dims are 1 x 1 counts as not transposed)",
            f"{OPS_TRANSFORMER_ACLNN} (CheckCaseSplitK, CheckSpecialTranspose); "
            f"{OPS_TRANSFORMER_950} (CheckNonMxQuantTransposeStatus)",
        ),
        Rule("k_match", "K of x equals K of the weight", f"{OPS_TRANSFORMER_ACLNN} (CheckShapeSameLengthTensorList)"),
        Rule(
            "inner_axis",
            "the inner (last in memory) axis of x and of the weight is at most 65535",
            f"{OPS_TRANSFORMER_ACLNN} (CheckShapeSameLengthTensorList, MAX_INNER_AXIS)",
        ),
        Rule(
            "group_list_tensor",
            "group_list is an INT64 tensor: 1-D of E entries (types 0/1) or [E, 2] (type 2), "
            "E = groups of the single weight (y for group_type 2), at most 1024",
            f"{OPS_TRANSFORMER_ACLNN} (CheckCommonParam, CheckGroupListSplitM); {WEIGHT_NZ_DOC} (groupType table)",
        ),
        Rule(
            "group_list_type",
            "group_list_type is 0 or 1, or 2 with group_type 0 and quantized x/weight "
            "(A2/A3: int8 only; 950: full quantization only)",
            f"{OPS_TRANSFORMER_ACLNN} (CheckCommonParam); {WEIGHT_NZ_DOC} (950 common constraints)",
        ),
        Rule(
            "act_type",
            "act_type 0 for non-quantized x/weight",
            f"{OPS_TRANSFORMER_ACLNN} (CheckFunctionParams: 'non quant case does not support activation')",
        ),
        Rule("tuning_config_950", "tuning_config is not supported on the 950", V5_DOC),
        Rule(
            "dtype_a2a3",
            "A2/A3: non-quantized x/weight are fp16 or bf16 (ND or NZ), or fp32 with single x, weight, y "
            "and ND; no FLOAT8 operand",
            f"{V5_DOC} (A2/A3 dtype table); {OPS_TRANSFORMER_ACLNN} (CheckFunctionParams)",
        ),
        Rule("output_dtype_nonquant", "non-quantized: y has the dtype of x", f"{V5_DOC}; {TORCH_NPU_META}"),
        Rule(
            "nz_format",
            "FRACTAL_NZ weights: fp16/bf16 only among float operands, a 3-D [E, K, N] view",
            f"{WEIGHT_NZ_DOC} (non-quant dtype tables)",
        ),
        Rule(
            "nz_align_950",
            "950, FRACTAL_NZ non-quantized weight: K and N 32-byte aligned",
            f"{WEIGHT_NZ_DOC} (Ascend 950PR/950DT, non-quant: 'weight n and k axes 32B aligned')",
        ),
        Rule(
            "gb_scales",
            "950 G-B (per-tile) fp8: scale [g, ceil(K/128), ceil(N/128)] and per_token_scale [M, ceil(K/128)], FLOAT32",
            f"{OPS_TRANSFORMER_950} (IsPerTileQuantMode, CheckGroupedMatmulPerTileShape)",
        ),
        Rule(
            "gb_transpose",
            "950 G-B fp8: the scale's transposition equals the weight's and per_token_scale's equals "
            "x's, unless the tensor's last two dims are 1 x 1",
            f"{OPS_TRANSFORMER_950} (CheckGroupedMatmulPerTile)",
        ),
        Rule(
            "gb_k_positive",
            "fp8 group_type 0: K > 0 and N > 0",
            f"{OPS_TRANSFORMER_950} (CheckGeneralQuantShape); {TORCH_NPU_META}",
        ),
        Rule(
            "group_list_len1_a2a3",
            "A2/A3: a counts list (group_list_type 1) may not have length 1",
            f"{V5_DOC} (A2/A3 groupListType 1; no host check for it "
            f"exists at {OPS_TRANSFORMER_ACLNN}: it may be a kernel-side limit)",
        ),
        Rule(
            "nz_k_n_one",
            "FRACTAL_NZ weights with K = 1 or N = 1 are refused",
            "vllm-ascend PRs #10287 and #16058 (they skip NZ for k = 1 / n = 1 because aclnnMatmulWeightNz rejects "
            "them); ASSUMED to hold for aclnnGroupedMatmulWeightNz, which no source confirms",
        ),
        Rule("cast_fp8", "aclnnCast: FLOAT8 source or target dtypes exist on the 950 only (A2/A3 list none)", CAST_DOC),
        Rule("index_select_fp8", "aclnnIndexSelect: no FLOAT8 self/out dtype", INDEX_SELECT_DOC),
        Rule(
            "group_list_values",
            "group_list values are device data: the host checks none of them; rows (K columns "
            "for group_type 2) outside the groups are left unwritten",
            f"{OPS_TRANSFORMER_ACLNN} (only the Python-list overload, aclIntArray, is checked for order); {V5_DOC}",
        ),
    )
}


def source_of(rule_id: str) -> str:
    """``rule_id: requires [source]``, the text every emulator rejection carries."""
    rule = RULES[rule_id]
    return f"rule {rule.id}: {rule.requires} [source: {rule.source}]"
