"""What the GPU tools here share: the start of a timing session, and the JSON they leave.
Imported by the tools beside it, each run as ``python -m tools.<name>``."""
from __future__ import annotations

import json
import time
from pathlib import Path


import torch

from harness.benchmarks import timing
from impls import registry


def start() -> tuple[timing.GpuTools, float]:
    """Every backend loaded, the timers' shared tools, and the copy ceiling (GB/s) of this
    session, printed with the date and the GPU."""
    registry.load_all()
    tools = timing.GpuTools()
    ceiling = timing.copy_ceiling_gbps("cuda", tools)[0]
    print(f"{time.strftime('%Y-%m-%d %H:%M')} {torch.cuda.get_device_name()} copy {ceiling:.0f} GB/s", flush=True)
    return tools, ceiling


def write_json(path: str, ceiling: float, results: list[dict], **extra) -> None:
    """The results with the ceiling, GPU and date they were measured with."""
    Path(path).write_text(json.dumps({"copy_gbps": ceiling, "gpu": torch.cuda.get_device_name(),
                                      "date": time.strftime("%Y-%m-%d"), **extra, "results": results}, indent=1))
