"""Train a 2-layer toy MoE model on the CPU with moe_hal.nn and print the routing histogram.

The task: each token is a random vector; its target is a fixed random nonlinear function of it,
different for each of a few hidden "clusters", so experts have something to specialise in. The
model is two residual blocks ``x + MoE(RMSNorm(x))`` and a linear head, trained with AdamW on a
mean-squared error; DeepSeek-style loss-free load balancing nudges each layer's router
correction bias towards under-used experts from ``MoE.tokens_per_expert``.

    python examples/train_moe.py [--steps 300] [--compile] [--layout contiguous|masked|auto]

Prints the loss every ``--log-every`` steps, then per layer how many slots each expert received
over the last step, and exits non-zero if the final loss is not below the first.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from moe_hal.nn import GroupedExperts, MoE, TopKRouter


class ToyMoEModel(nn.Module):
    """``num_layers`` residual MoE blocks on ``[T, hidden]`` tokens, then a linear head."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, intermediate: int, num_layers: int, layout: str):
        super().__init__()
        self.norms = nn.ModuleList(nn.RMSNorm(hidden) for _ in range(num_layers))
        self.moes = nn.ModuleList(
            MoE(
                TopKRouter(hidden, num_experts, top_k, score="sigmoid", correction_bias=True),
                GroupedExperts(num_experts, hidden, intermediate),
                layout=layout,
                masked_capacity=64,
            )
            for _ in range(num_layers)
        )
        self.head = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, moe in zip(self.norms, self.moes):
            x = x + moe(norm(x))
        return self.head(x)


def make_task(hidden: int, clusters: int, gen: torch.Generator):
    centers = torch.randn(clusters, hidden, generator=gen) * 2
    maps = torch.randn(clusters, hidden, hidden, generator=gen) / hidden**0.5

    def batch(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        cluster = torch.randint(clusters, (tokens,), generator=gen)
        x = centers[cluster] + torch.randn(tokens, hidden, generator=gen)
        y = torch.tanh(torch.einsum("th,thk->tk", x, maps[cluster]))
        return x, y

    return batch


def histogram(counts: torch.Tensor, width: int = 40) -> str:
    peak = max(int(counts.max()), 1)
    return "\n".join(
        f"    expert {e:2d} {int(c):5d} {'#' * round(width * int(c) / peak)}" for e, c in enumerate(counts)
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--tokens", type=int, default=256, help="tokens per step")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--layout", default="contiguous", choices=("contiguous", "masked", "auto"))
    p.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) the model")
    p.add_argument("--bias-rate", type=float, default=1e-3, help="correction-bias update per step (0: off)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    batch = make_task(args.hidden, clusters=args.experts, gen=gen)
    model = ToyMoEModel(args.hidden, args.experts, args.top_k, 2 * args.hidden, num_layers=2, layout=args.layout)
    step_fn = torch.compile(model, fullgraph=True) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    losses = []
    for step in range(args.steps):
        x, y = batch(args.tokens)
        loss = nn.functional.mse_loss(step_fn(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():  # loss-free balancing: favour under-used experts
            for moe in model.moes:
                load = moe.tokens_per_expert.float()
                moe.router.correction_bias += args.bias_rate * torch.sign(load.mean() - load)
        losses.append(loss.item())
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {losses[-1]:.4f}")

    for i, moe in enumerate(model.moes):
        print(f"layer {i} routing histogram (slots per expert, last step of {args.tokens} tokens x top-{args.top_k}):")
        print(histogram(moe.tokens_per_expert))
    first, last = sum(losses[:5]) / min(5, len(losses)), sum(losses[-5:]) / min(5, len(losses))
    print(f"mean loss of the first 5 steps {first:.4f} -> last 5 steps {last:.4f}")
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())
