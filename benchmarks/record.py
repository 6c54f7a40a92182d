"""A benchmark's results as one dated JSON file: what was measured, with the date, machine,
device, torch version and commit it was measured at."""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    """``PIPELINE_COMMIT`` when set (a copy of the tree, as the device machine gets, may carry an
    older git history), else the checkout's short HEAD."""
    named = os.environ.get("PIPELINE_COMMIT")
    if named:
        return named
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return done.stdout.strip() or "unknown"


def write_record(out_dir: str | os.PathLike, stem: str, fields: dict) -> Path:
    """Write ``fields`` with the date, machine, device, torch and commit to
    ``out_dir/<stem>-<date>.json``; returns the path."""
    import torch
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.node(),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
              "torch": torch.__version__, "commit": commit(), **fields}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}-{datetime.date.today()}.json"
    path.write_text(json.dumps(record, indent=1))
    return path


__all__ = ["commit", "write_record"]
