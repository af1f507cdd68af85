"""Loaded at start-up by every stage process that bench/gpu_stages.py runs (this folder is first on the
child's PYTHONPATH), so the stage scripts run unchanged:

- ``GPU_STAGES_CAP_GIB``: cap the CUDA caching allocator at that many GiB
  (``torch.cuda.set_per_process_memory_fraction``), as a smaller card would;
- ``GPU_STAGES_RECORD``: at exit, write the process's peaks there as JSON: CUDA allocated and reserved
  bytes, allocator OOM events, and the peak resident host memory.
"""
import os

# popped, not read: a process the stage starts (the math-verify worker) must neither import torch and
# take a CUDA context at start-up nor overwrite the stage's record at its own exit
_RECORD, _CAP = os.environ.pop("GPU_STAGES_RECORD", None), os.environ.pop("GPU_STAGES_CAP_GIB", None)

if _RECORD:
    import atexit
    import json
    import resource

    import torch

    def _cap() -> None:
        if _CAP and torch.cuda.is_available():
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(float(_CAP) * 2**30 / total)

    def _record() -> None:
        gib = 2**30
        out = {"peak_rss_GiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / gib, 3)}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out.update(peak_allocated_GiB=round(torch.cuda.max_memory_allocated() / gib, 3),
                       peak_reserved_GiB=round(torch.cuda.max_memory_reserved() / gib, 3),
                       allocator_ooms=int(torch.cuda.memory_stats().get("num_ooms", 0)))
        with open(_RECORD, "w") as fh:
            json.dump(out, fh)

    _cap()
    atexit.register(_record)
