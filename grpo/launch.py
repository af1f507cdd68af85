"""A stage that asks for more than one process relaunches itself under ``torchrun``.

``dvc repro`` and ``dvc exp run`` run ``python -m stages.<stage>``; when the stage's section sets
``num_processes`` (processes on this host) or ``nnodes`` (hosts) above 1, that process replaces itself
with ``python -m torch.distributed.run ... -m stages.<stage> <same arguments>``, whose workers find
torchrun's variables and join the process group instead (grpo.distributed.init_from_env). The DVC
command stays the user's command; torchrun's exit status is the stage's.

One host: ``--standalone`` (a local rendezvous on a free port). Several hosts: every host runs the
same stage, and torchrun's c10d rendezvous meets at ``GRPO_RDZV_ENDPOINT`` (host:port of one of them);
``GRPO_RDZV_ID`` names the job (default: the stage name), so two jobs sharing an endpoint do not mix.
Where the rendezvous is, is a property of the cluster, not of the run: an environment variable, not a
param.
"""
from __future__ import annotations

import logging
import os
import sys

from grpo.distributed import launched

log = logging.getLogger(__name__)
ENDPOINT_ENV = "GRPO_RDZV_ENDPOINT"
ID_ENV = "GRPO_RDZV_ID"


def torchrun_command(module: str, args: list[str], num_processes: int, nnodes: int, stage: str) -> list[str]:
    """The command that runs ``python -m module args`` as ``num_processes`` × ``nnodes`` processes."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(num_processes),
           "--nnodes", str(nnodes)]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        endpoint = os.environ.get(ENDPOINT_ENV)
        if not endpoint:
            raise ValueError(f"{stage}.nnodes is {nnodes}: set {ENDPOINT_ENV}=host:port (one of the hosts, "
                             f"reachable from all) on every host, and run the stage on each of them")
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", os.environ.get(ID_ENV, stage)]
    return cmd + ["-m", module, *args]


def relaunch_if_asked(stage: str, section: object) -> None:
    """Replace this process with torchrun when ``section`` (the stage's params) asks for more than one
    process and this process is not already one of torchrun's workers. Returns when nothing to do."""
    num_processes = getattr(section, "num_processes", 1)
    nnodes = getattr(section, "nnodes", 1)
    if launched() or (num_processes == 1 and nnodes == 1):
        return
    cmd = torchrun_command(f"stages.{stage}", sys.argv[1:], num_processes, nnodes, stage)
    log.info("%s.num_processes %d, nnodes %d: relaunching as %s", stage, num_processes, nnodes, " ".join(cmd))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)
