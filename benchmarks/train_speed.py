"""Training speed against the machine's own matmul peak, all measured in one process so load cancels out.

    python -m benchmarks.train_speed [--data DATASET] [--threads N] [--steps N] [--big-steps N]

Measures the bf16 and fp32 matmul peak (GFLOP/s by wall and by CPU time), then real training steps
(forward + backward + AdamW under bf16 autocast, gradient clipping, the shipped loss) on real batches
of the data module for byt5-tiny, byt5-mini and a ByT5-small-shaped encoder (google/byt5-small's
encoder: d_model 1472, d_ff 3584, 12 layers, 6 heads of 64; built from a T5Config, no download).
Prints figures; it asserts nothing (timed tests would be flaky).

FLOPs are counted analytically, per encoder layer and sequence of length L (MACs x 2 = FLOPs):
    projections  2 * L * 4 * d_model * (heads * d_kv)        (q, k, v, o)
    attention    2 * 2 * L^2 * (heads * d_kv)                 (QK^T and AV)
    feed-forward 2 * L * 3 * d_model * d_ff                   (gated GELU: wi_0, wi_1, wo)
A training step costs 3x the forward (backward = 2x forward for matmuls); embeddings, norms, softmax,
pooling and the loss are left out (a few % at most). "Executed" counts the shapes the encoder was
actually called with (rows x padded width of each call); "useful" counts each sequence at its real
length. Padding overhead = executed tokens / real tokens.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from jsonargparse.typing import PositiveInt

from benchmarks.arguments import benchmark_parser, run
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.data.samplers import EpochShuffledSampler
from leanagent.distributed import local_cpu_count
from leanagent.models import encoder as encoder_module
from leanagent.models.losses import batch_loss
from leanagent.models.retriever import PremiseRetriever

BYT5_SMALL_SHAPE = dict(d_model=1472, d_kv=64, num_heads=6, d_ff=3584, num_layers=12)
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "mathlib-order"


def matmul_peak(dtype: torch.dtype, size: int = 2048, seconds: float = 2.0) -> tuple[float, float]:
    """GFLOP/s of square matmuls (by wall time, by CPU time), the best of a few timed bursts."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    flops = 2 * size**3
    best_wall = best_cpu = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(3):
            a @ b
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        best_wall = max(best_wall, 3 * flops / wall / 1e9)
        best_cpu = max(best_cpu, 3 * flops / max(cpu, 1e-9) / 1e9)
    return best_wall, best_cpu


def forward_flops(shape: dict[str, int], rows: int, width: int) -> float:
    """Forward FLOPs of the encoder stack on `rows` sequences of `width` tokens (see the module docstring)."""
    d, inner, d_ff, layers = shape["d_model"], shape["num_heads"] * shape["d_kv"], shape["d_ff"], shape["num_layers"]
    per_layer = 2 * rows * width * (4 * d * inner + 3 * d * d_ff) + 4 * rows * width * width * inner
    return float(layers * per_layer)


class ShapeRecorder:
    """Records (rows, padded width) of every encoder call and the real lengths of its rows."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls: list[tuple[int, int]] = []
        self.lengths: list[np.ndarray] = []
        module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        ids, mask = args
        self.calls.append(tuple(ids.shape))
        self.lengths.append(mask.sum(dim=1).numpy())

    def reset(self) -> None:
        self.calls.clear()
        self.lengths.clear()

    def flops(self, shape: dict[str, int]) -> tuple[float, float, int, int]:
        """(executed, useful) training FLOPs and (executed, real) tokens since the last reset."""
        executed = sum(forward_flops(shape, r, w) for r, w in self.calls)
        useful = sum(forward_flops(shape, 1, int(n)) for lengths in self.lengths for n in lengths)
        return 3 * executed, 3 * useful, sum(r * w for r, w in self.calls), int(sum(l.sum() for l in self.lengths))


def batches(datamodule: RetrievalDataModule, batch_size: int, count: int):
    """The first `count` batches of epoch 0's training order on one rank, collated as in training."""
    sampler = EpochShuffledSampler(datamodule.train_pairs, num_replicas=1, rank=0, seed=datamodule.seed)
    sampler.set_epoch(0)
    order = list(sampler)
    pairs = datamodule.train_pairs
    return [datamodule.collate_train([pairs[i] for i in order[k * batch_size : (k + 1) * batch_size]]) for k in range(count)]


def train_steps(
    name: str, shape: dict[str, int], data: list[dict], accumulate: int, peak: float, peak_cpu: float, **model_args
) -> dict:
    """Time training steps on `data` after one warm-up step; print and return the figures."""
    model = PremiseRetriever(model_name=name, loss="infonce", lr=2e-3, **model_args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    recorder = ShapeRecorder(model.encoder)

    def step(batch: dict, index: int) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = batch_loss(model, batch, "infonce")
        (loss / accumulate).backward()
        if (index + 1) % accumulate == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    step(data[0], -1)  # warm-up: allocator, kernels
    optimizer.zero_grad(set_to_none=True)
    recorder.reset()
    wall, cpu = time.perf_counter(), time.process_time()
    for index, batch in enumerate(data[1:]):
        step(batch, index)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    executed, useful, executed_tokens, real_tokens = recorder.flops(shape)
    examples = sum(len(b["index"]) for b in data[1:])
    result = dict(
        examples_per_s=examples / wall,
        padding=executed_tokens / real_tokens,
        executed_gflops=executed / wall / 1e9,
        useful_gflops=useful / wall / 1e9,
        executed_pct=100 * executed / cpu / 1e9 / peak_cpu,
        useful_pct=100 * useful / cpu / 1e9 / peak_cpu,
        useful_pct_wall=100 * useful / wall / 1e9 / peak,
        seconds_per_step=wall / len(data[1:]),
        encoder_calls=len(recorder.calls) / len(data[1:]),
    )
    params = sum(p.numel() for p in model.encoder.parameters())
    print(
        f"{name:<11} {params / 1e6:7.2f}M  {result['examples_per_s']:8.2f} ex/s  {result['seconds_per_step']:7.3f} s/step"
        f"  {result['encoder_calls']:4.1f} calls/step  padding {result['padding']:.2f}x"
        f"  executed {result['executed_gflops']:6.1f} GFLOP/s ({result['executed_pct']:4.1f}% of peak by CPU time)"
        f"  useful {result['useful_gflops']:6.1f} GFLOP/s ({result['useful_pct']:4.1f}% by CPU time,"
        f" {result['useful_pct_wall']:4.1f}% by wall)"
    )
    return result


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a dataset folder (corpus.jsonl, random/)")
    parser.add_argument("--threads", type=PositiveInt, default=1, help="torch threads (the shipped config gives each CPU rank 1)")
    parser.add_argument("--steps", type=PositiveInt, default=24, help="timed batches for byt5-tiny and byt5-mini")
    parser.add_argument("--big-steps", type=PositiveInt, default=2, help="timed batches for the ByT5-small shape")
    parser.add_argument("--big-batch-size", type=PositiveInt, default=2, help="pairs per batch for the ByT5-small shape")
    parser.add_argument("--big-chunk-cost", type=float, default=512.0,
                        help="model.chunk_cost for the ByT5-small shape (a call costs little beside its tokens)")
    parser.add_argument("--batch-size", type=PositiveInt, default=8, help="pairs per batch (shipped: 8)")
    parser.add_argument("--ranks", type=PositiveInt, default=4, help="ranks of the shipped config, for the epoch estimate")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    datamodule = RetrievalDataModule(
        data_path=str(args.data / "random"), corpus_path=str(args.data / "corpus.jsonl"), batch_size=args.batch_size
    )
    pairs = len(datamodule.train_pairs)
    print(f"{args.data.name}: {pairs:,} training pairs; {args.threads} thread(s)")
    bf16, bf16_cpu = matmul_peak(torch.bfloat16)
    fp32, fp32_cpu = matmul_peak(torch.float32)
    print(f"matmul peak bf16 {bf16:6.1f} GFLOP/s by wall, {bf16_cpu:6.1f} by CPU time;"
          f" fp32 {fp32:6.1f} by wall, {fp32_cpu:6.1f} by CPU time")
    encoder_module.PRESETS.setdefault("byt5-small-shape", BYT5_SMALL_SHAPE)
    data = batches(datamodule, args.batch_size, args.steps + 1)
    tiny = train_steps("byt5-tiny", encoder_module.PRESETS["byt5-tiny"], data, 4, bf16, bf16_cpu)
    train_steps("byt5-mini", encoder_module.PRESETS["byt5-mini"], data, 4, bf16, bf16_cpu)
    big = batches(datamodule, args.big_batch_size, args.big_steps + 1)
    train_steps("byt5-small-shape", BYT5_SMALL_SHAPE, big, 1, bf16, bf16_cpu, chunk_cost=args.big_chunk_cost)
    # The shipped config runs `ranks` processes of `threads` threads each over the machine's cores: one
    # rank's throughput per thread times the cores, before any DDP or Lightning cost.
    cores = local_cpu_count()
    rate = tiny["examples_per_s"] / args.threads * cores
    print(f"byt5-tiny epoch of {args.data.name} ({pairs:,} pairs) at {rate:.1f} ex/s over {cores} cores:"
          f" ~{pairs / rate / 60:.1f} min of training steps (no DDP, Lightning or validation)")


if __name__ == "__main__":
    run(main)
