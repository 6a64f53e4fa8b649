"""FLANC's composed character LSTM: recurrent gate matrices built once per forward against once per step.

The recurrence of :class:`subfl.models.char_rnn.CharLSTM` applies each recurrent gate at every time step. With
FLANC's composed gates (:class:`subfl.models.composed.ComposedLinear`) the gate's matrix is a product of basis and
coefficients; :func:`subfl.models.char_rnn.per_forward_map` builds it once per forward. This script times one
forward + backward of a mini-batch both ways, in one process with the same threads, on FLANC's Shakespeare model
(vocabulary 80, sequence 80, width 0.25 — the book's cpu preset — and width 1), and prints the ratio (median of
``--repeats``; > 1: building once is faster).

    python benchmarks/bench_composed_lstm.py [--repeats 5] [--batch 10] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from subfl.models.char_rnn import GATES, CharLSTM
from subfl.models.composed import compose_model, composition_plan


def composed_lstm(width: float) -> CharLSTM:
    model = CharLSTM(80, (80,), width=width)
    plan = composition_plan({1.0: model})
    compose_model(model, {n: (s.r1, s.r2) for n, s in plan.items()})
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    return model


def per_step_forward(model: CharLSTM, tokens: torch.Tensor) -> torch.Tensor:
    """The recurrence with every recurrent gate called as a layer at every step (its matrix built each time)."""
    z = model.input_map(model.embedding(tokens))
    x_parts = {g: model.x_gates[g](z) for g in GATES}
    h = z.new_zeros(tokens.shape[0], model.hidden_size)
    c = torch.zeros_like(h)
    for t in range(model.seq_len):
        pre = {g: x_parts[g][:, t] + model.h_gates[g](h) for g in GATES}
        c = torch.sigmoid(pre["forget"]) * c + torch.sigmoid(pre["input"]) * torch.tanh(pre["cell"])
        h = torch.sigmoid(pre["output"]) * torch.tanh(c)
    return model.classifier(h)


def seconds(step, repeats: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    for name in ("repeats", "batch", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for width in (0.25, 1.0):
        model = composed_lstm(width)
        tokens = torch.randint(0, 80, (args.batch, 80))

        def once() -> None:
            model.zero_grad()
            model(tokens).square().sum().backward()

        def every_step() -> None:
            model.zero_grad()
            per_step_forward(model, tokens).square().sum().backward()

        built_once, built_every_step = seconds(once, args.repeats), seconds(every_step, args.repeats)
        print(f"width {width:g}: built per step {built_every_step * 1e3:.1f} ms, built per forward "
              f"{built_once * 1e3:.1f} ms, ratio {built_every_step / built_once:.2f}x")


if __name__ == "__main__":
    main()
