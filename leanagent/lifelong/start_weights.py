"""The weights a lifelong run's first stage starts from (`init_from`), recorded so that a resumed run can tell
when the file behind the same name has changed.

The run's fingerprint covers its settings and the stage configs' text, so `init_from: leanagent-base` is the
same string before and after a new release of the shipped retriever; the sha256 of the file it names is not.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from leanagent.errors import LeanAgentError
from leanagent.io import file_sha256
from leanagent.pretrained import resolve as resolve_weights


def start_weights(resolved_fit_config: str, fit_dir: Path) -> dict | None:
    """What the first stage's fit starts from (its resolved `model.init_args.init_from`) and the sha256 of that
    file, so that a resumed run can tell when the weights behind the same name changed; None from random weights."""
    model = (yaml.safe_load(resolved_fit_config) or {}).get("model") or {}
    init_from = (model.get("init_args") or model).get("init_from") if isinstance(model, dict) else None
    if init_from is None:
        return None
    path = resolve_weights(str(init_from), relative_to=fit_dir)
    return {"init_from": str(init_from), "path": str(path), "sha256": file_sha256(path)}


def check_start_weights(recorded: dict | None, now: dict | None, out: Path) -> None:
    """A run resumed on other starting weights than it began with is another run (its finished stages learned
    from the old ones): refused, as other settings are."""
    if recorded is None:
        return
    # The weights, not where they lie: a checkout moved or reinstalled elsewhere finds the same file at another path.
    if now is not None and (now["init_from"], now["sha256"]) == (recorded["init_from"], recorded["sha256"]):
        return
    if now is None or now.get("init_from") != recorded.get("init_from"):
        raise LeanAgentError(f"{out} holds a lifelong run with other settings; choose another output_dir or delete it")
    named = recorded["path"] if recorded["path"] == recorded["init_from"] else f"'{recorded['init_from']}' ({recorded['path']})"
    raise LeanAgentError(
        f"model.init_from: {named} has changed since the run in {out} started from it (sha256 {now['sha256'][:12]}... "
        f"now, {recorded['sha256'][:12]}... then); choose another output_dir or delete it"
    )


def recorded_start_unchanged(recorded: dict | None, out: Path) -> None:
    """After stage 0 the stages start from checkpoints; the recorded start file, where it is still there, must be unchanged."""
    if recorded is None or not Path(recorded["path"]).is_file():
        return
    check_start_weights(recorded, {**recorded, "sha256": file_sha256(Path(recorded["path"]))}, out)
