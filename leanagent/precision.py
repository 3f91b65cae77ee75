"""The precision a run computes in: the configured one, except bf16 on a CPU that can only emulate it.

LeanAgent's configs say `bf16-mixed`, which GPUs and CPUs with native bf16 (AVX512 with oneDNN, AMX, Arm
BF16) run fast. A CPU without it (AVX2 only, as on most laptops) runs every bf16 matmul in a reference loop:
a training step of the project recipe took about 9x as long as in float32 on one (docs/measurements.md).
So on such a CPU, `cpu_bf16: auto` (the default) runs float32 instead and says so; `always` keeps bf16.
"""

from __future__ import annotations

from typing import Any, Literal

from leanagent import compat
from leanagent.distributed import uses_cpu

CpuBf16 = Literal["auto", "always"]
BF16_PRECISIONS = ("bf16", "bf16-mixed", "bf16-true")
# Lightning's precision settings that an evaluation can run in (its Trainer also takes plugins' names).
PRECISIONS = ("64-true", "32-true", "16-mixed", "16-true", *BF16_PRECISIONS, "64", "32", "16", 64, 32, 16)
CPU_FALLBACK = "32-true"


def run_precision(precision: Any, accelerator: str = "auto", cpu_bf16: CpuBf16 = "auto") -> Any:
    """`precision`, or float32 where it names bf16, the run is on a CPU without native bf16, and `cpu_bf16` is auto."""
    if cpu_bf16 == "always" or str(precision) not in BF16_PRECISIONS or not uses_cpu(str(accelerator)):
        return precision
    return precision if compat.cpu_has_native_bf16() else CPU_FALLBACK


def describe_fallback(precision: Any, resolved: Any) -> str | None:
    """The one log line for a precision `run_precision` changed; None when it kept it."""
    if resolved == precision:
        return None
    return (f"precision {precision} -> {resolved}: this CPU has no native bf16 (every bf16 matmul would be emulated, "
            f"several times slower than float32); --cpu_bf16=always keeps {precision}")
