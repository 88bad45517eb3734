"""The GPUs this server will see, and per-GPU ``instance_group``s generated for them.

Configs under ``configs/gpu*.pbtxt`` say *how many* instances a model wants on a GPU; which GPUs
exist is a fact of the machine, so the ``gpus`` lists are generated at start (by the launcher or
the container's entrypoint), never hand-edited.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

QUERY = "index,uuid,name,memory.total"


@dataclass(frozen=True)
class Gpu:
    """One GPU as CUDA (and so Triton) numbers it inside this process."""

    index: int
    uuid: str
    name: str
    memory_mib: int


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse the CSV of ``nvidia-smi --query-gpu=<QUERY> --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.strip().splitlines():
        index, uuid, name, memory = (part.strip() for part in line.split(","))
        gpus.append(Gpu(int(index), uuid, name, int(float(memory))))
    return gpus


def visible(gpus: Sequence[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs CUDA exposes under ``CUDA_VISIBLE_DEVICES``, renumbered from 0 as CUDA does.

    Entries are indices or UUIDs (``GPU-...``); CUDA stops at the first invalid one.
    """
    if cuda_visible_devices is None:
        return list(gpus)
    chosen = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        match = [g for g in gpus if entry and (str(g.index) == entry or g.uuid.startswith(entry))]
        if not match:
            break
        chosen.append(match[0])
    return [Gpu(i, g.uuid, g.name, g.memory_mib) for i, g in enumerate(chosen)]


def discover() -> list[Gpu]:
    """The GPUs visible to a process started now (empty without a driver or GPUs)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    result = subprocess.run(
        [smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        return []
    return visible(parse_nvidia_smi(result.stdout), os.environ.get("CUDA_VISIBLE_DEVICES"))


def place_instances(config: mc.ModelConfig, gpus: Sequence[Gpu], per_gpu: int | None) -> None:
    """Replace each KIND_GPU group without a ``gpus`` list by one group per GPU present.

    Args:
        config: modified in place.
        gpus: the machine's GPUs; none turns those groups into KIND_CPU (same count), so the
            same configs run, slowly, on a machine without a GPU.
        per_gpu: instances per GPU; None keeps each group's own count.
    """
    groups = []
    for group in config.instance_group:
        if group.kind != mc.ModelInstanceGroup.KIND_GPU or group.gpus:
            groups.append(group)
            continue
        count = per_gpu or group.count or 1
        if not gpus:
            groups.append(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=count))
        for gpu in gpus:
            placed = mc.ModelInstanceGroup()
            placed.CopyFrom(group)
            placed.name = f"{config.name}_gpu{gpu.index}"
            placed.count = count
            placed.gpus[:] = [gpu.index]
            groups.append(placed)
    del config.instance_group[:]
    config.instance_group.extend(groups)
