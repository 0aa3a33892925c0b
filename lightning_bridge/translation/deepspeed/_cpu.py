"""DeepSpeed on its CPU accelerator, as the bridge runs it: before DeepSpeed's process group
starts, its shared-memory all-reduce kernel is kept from compiling and its all-gathers are
made to complete before they return. DeepSpeedTrial's runner calls this, and so does
`determined.transformers` for a Hugging Face Trainer given `--deepspeed`."""

from __future__ import annotations

import functools
from typing import Any

# DeepSpeed's shared-memory all-reduce kernel of its CPU accelerator (`ShareMemCommBuilder`).
SHM_KERNEL = "deepspeed_shm_comm"


def _without_cpu_shm_kernel(deepspeed: Any) -> None:
    """Keep DeepSpeed from compiling its CPU shared-memory all-reduce kernel when its process
    group starts: on the CPU accelerator it builds it then (minutes of C++ compilation on
    first use) unless it was built at install (`DS_BUILD_SHM_COMM=1`). The kernel serves only
    `inference_all_reduce` (inference's tensor-parallel layers), which uses the process
    group's all_reduce without it; training's collectives are the process group's either
    way. DeepSpeed skips an op its compatibility table marks unavailable; its table is one
    dict per process, read when the group starts."""
    if deepspeed.accelerator.get_accelerator().device_name() != "cpu":
        return
    from deepspeed.git_version_info import installed_ops

    if installed_ops.get(SHM_KERNEL, False):
        return  # built at install: loading it costs nothing
    deepspeed.ops.__compatible_ops__[SHM_KERNEL] = False


def _complete_cpu_all_gathers(deepspeed: Any) -> None:
    """Make DeepSpeed's all-gathers complete before they return, on the CPU accelerator.

    ZeRO 3 gathers a list of parameters with one asynchronous all-gather each and waits on the
    last one only, then reads every output (`_allgather_params_coalesced`, up to DeepSpeed
    0.19.8 at least: after every optimizer step for the persistent parameters). On a GPU the
    gathers run in order on one stream; on gloo each runs on a worker thread of its own, so an
    earlier one may still be writing its output when it is read: the weights then differ
    from run to run (uninitialized values at worst). Waiting on each gather as it is started
    keeps the order DeepSpeed assumes; the gloo all-gathers of a CPU run are not overlapped
    with computation anyway."""
    if deepspeed.accelerator.get_accelerator().device_name() != "cpu":
        return
    comm = deepspeed.comm
    started = comm.all_gather_into_tensor
    if getattr(started, "_lightning_bridge_completes", False):
        return

    @functools.wraps(started)
    def all_gather_into_tensor(*args: Any, **kwargs: Any) -> Any:
        work = started(*args, **kwargs)
        if kwargs.get("async_op") and work is not None:
            work.wait()
        return work

    all_gather_into_tensor._lightning_bridge_completes = True  # type: ignore[attr-defined]
    comm.all_gather_into_tensor = all_gather_into_tensor


def prepare_cpu_accelerator(deepspeed: Any) -> None:
    """Both of the above (nothing on another accelerator); call it before DeepSpeed's process
    group starts."""
    _without_cpu_shm_kernel(deepspeed)
    _complete_cpu_all_gathers(deepspeed)
