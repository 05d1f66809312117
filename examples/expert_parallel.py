"""Expert parallelism with moe_hal.ep: one MoE layer's experts sharded over the ranks.

Run it with torchrun on any torch.distributed backend (gloo on CPUs, NCCL on CUDA, HCCL on Ascend):

    torchrun --nproc-per-node 4 examples/expert_parallel.py                 # gloo on the CPU
    torchrun --nproc-per-node 8 examples/expert_parallel.py --backend nccl  # one GPU per rank

or as a plain script, which spawns 4 local gloo processes itself (moe_hal.ep.spawn_local).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import moe_hal
from moe_hal import ep

E, H, N, K_TOP, T = 16, 256, 128, 4, 64  # experts, hidden, expert output, top-k, tokens per rank


def step(rank: int, world: int, device: str = "cpu") -> float:
    """One forward pass of routed experts; returns this rank's output norm."""
    g = ep.EPGroup(None, num_experts=E)  # rank r holds experts [r*E/W, (r+1)*E/W)
    torch.manual_seed(0)  # the same expert weights everywhere, then our shard
    w_all = torch.randn(E, N, H) / H**0.5
    w_local = w_all[list(g.local_experts)].to(device)
    torch.manual_seed(1 + rank)  # each rank its own tokens
    x = torch.randn(T, H, device=device)
    topk_weights, topk_ids = torch.randn(T, E, device=device).softmax(-1).topk(K_TOP, dim=-1)

    d = ep.dispatch(x, topk_ids, topk_weights, g, mode="exact", alignment=8)
    y = ep.combine(moe_hal.grouped_gemm(d.a, w_local, d.layout), d)  # [T, N] back on this rank
    # Decode under CUDA graphs: mode="capacity", capacity=C gives a MaskedLayout and no host sync.
    dc = ep.dispatch(x, topk_ids, topk_weights, g, mode="capacity", capacity=T * K_TOP // E * 2, overflow="drop")
    yc = ep.combine(moe_hal.grouped_gemm(dc.a, w_local, dc.layout), dc)
    same = torch.equal(y, yc) if int(dc.dropped) == 0 else "n/a (slots dropped)"
    print(
        f"rank {rank}: {T} tokens, received {d.recv_counts.tolist()} rows from ranks 0..{world - 1}, "
        f"|y| {y.norm():.4f}, capacity mode equal: {same}"
    )
    return float(y.norm())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--backend",
        default="gloo",
        choices=("gloo", "nccl", "hccl"),
        help="torch.distributed backend under torchrun (hccl needs torch_npu imported)",
    )
    args = p.parse_args()
    if "RANK" in os.environ:  # launched by torchrun
        dist.init_process_group(args.backend)
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", rank))
        device = {"gloo": "cpu", "nccl": f"cuda:{local}", "hccl": f"npu:{local}"}[args.backend]
        if args.backend == "nccl":
            torch.cuda.set_device(local)
        step(rank, world, device)
        dist.destroy_process_group()
    else:
        ep.spawn_local(step, 4)


if __name__ == "__main__":
    main()
