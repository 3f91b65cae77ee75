"""PyTorch's flight recorder (each rank's last collectives, gloo and NCCL): switched on, dumped on a stall, summarised."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from leanagent import compat

log = logging.getLogger("leanagent")


def set_flight_recorder_env() -> dict[str, str]:
    """PyTorch's NCCL flight recorder and dump-on-timeout, where the user has not set them.

    torch reads: TORCH_FR_BUFFER_SIZE (or the older TORCH_NCCL_TRACE_BUFFER_SIZE) for the number of
    recorded collectives (0, the default, disables the recorder), TORCH_NCCL_DUMP_ON_TIMEOUT to dump
    it when a collective times out (needs TORCH_NCCL_ENABLE_MONITORING, on by default), and
    TORCH_FR_DUMP_TEMP_FILE (or TORCH_NCCL_DEBUG_INFO_TEMP_FILE) as the dump files' prefix, set by
    the Watchdog to the heartbeat folder. With the 364-day timeout NCCL's own dump-on-timeout
    practically never fires; the recorder itself (which torch also keeps for gloo) is what the
    watchdog dumps on a stall (`dump_flight_recorder`).
    """
    changed = {}
    env = os.environ
    if "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        changed["TORCH_FR_BUFFER_SIZE"] = "2000"
    if "TORCH_NCCL_DUMP_ON_TIMEOUT" not in env:
        changed["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    env.update(changed)
    return changed


def set_dump_prefix(folder: Path) -> None:
    """NCCL's own dump-on-timeout writes next to the heartbeats, unless the user chose a place."""
    if "TORCH_FR_DUMP_TEMP_FILE" not in os.environ and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in os.environ:
        os.environ["TORCH_FR_DUMP_TEMP_FILE"] = str(folder.resolve() / "flight-recorder-rank")


def dump_flight_recorder(folder: Path, rank: int) -> Path | None:
    """This rank's flight recorder as JSON in the heartbeat folder; None when there is none to dump.

    Needs TORCH_FR_BUFFER_SIZE > 0 before the process group exists (`set_flight_recorder_env`).
    """
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        path = folder / f"flight-recorder-rank{rank}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_bytes(compat.flight_recorder_json())
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        return path
    except Exception as e:  # a torch without the recorder, or a recorder that is off
        log.debug("flight recorder dump failed: %s", e)
        return None


def last_collective(path: Path) -> dict[str, Any] | None:
    try:
        entries = json.loads(path.read_text()).get("entries") or []
    except (OSError, ValueError, AttributeError):
        return None
    return max(entries, key=lambda e: e.get("collective_seq_id", 0)) if entries else None


def flight_recorder_summary(path: Path) -> str | None:
    """`last collective #57 gloo:all_reduce (scheduled, created 3.2 s ago; ...)` from `dump_flight_recorder`'s file."""
    last = last_collective(path)
    if last is None:
        return None
    created = last.get("time_created_ns") or 0
    ago = f", created {time.time() - created / 1e9:.1f} s ago" if created else ""
    return (f"last collective #{last.get('collective_seq_id')} {last.get('profiling_name')} "
            f"({last.get('state')}{ago}; flight recorder in {path.name})")
