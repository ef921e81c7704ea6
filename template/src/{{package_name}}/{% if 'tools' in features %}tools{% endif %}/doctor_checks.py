"""What doctor finds out, one question a function: versions, GPUs and the links between them,
backends, whether a port is free, and the all-reduce bandwidth between ranks.

Bandwidth: an all-reduce of S bytes that takes t seconds has an "algorithm bandwidth" S/t. A
ring all-reduce sends 2(n-1)/n x S bytes through every rank's link, so the "bus bandwidth"
S/t x 2(n-1)/n is comparable with the link's own speed whatever the number of ranks n (the
convention of nccl-tests). Small messages measure latency; the largest one, the link.
"""

import platform
import re
import shutil
import socket
import subprocess
import time
from typing import Any

import torch
import torch.distributed as torch_dist

from ..engine import dist

# Peak one-way NVLink bandwidth per GPU of these GPUs (SXM boards), in GB/s: links x GB/s each.
NVLINK_GBPS = {"V100": 150, "A100": 300, "A800": 200, "H100": 450, "H800": 200, "H200": 450}
NVLINK_GBPS |= {"B200": 900}
PCIE_LANE_GBPS = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}  # one-way, after encoding


def versions() -> dict[str, Any]:
    """Python, torch, and the CUDA and NCCL that torch was built with."""
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,  # the CUDA torch was built with; None for a CPU build
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
    }


def gpus() -> list[dict[str, Any]]:
    """The GPUs this process sees: name, memory and compute capability."""
    found = []
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(index)
        found.append(
            {
                "index": index,
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}",
            }
        )
    return found


def nvidia_smi(*args: str) -> str | None:
    """nvidia-smi's output, or None where it is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_topology(matrix: str) -> dict[str, str]:
    """GPU pairs of `nvidia-smi topo -m` and their link: {"0-1": "NV18", "0-2": "SYS", ...}.

    NV# is NVLink (# links); PIX, PXB, PHB, NODE and SYS go over PCIe, the last two also
    through the CPUs' interconnect.
    """
    # Rows start with their GPU's name; the header row starts with a tab.
    rows = [line.split() for line in matrix.splitlines() if re.match(r"GPU\d+\s", line)]
    links = {}
    for row in rows:
        i = int(row[0][3:])
        for j, link in enumerate(row[1 : len(rows) + 1]):
            if i < j:
                links[f"{i}-{j}"] = link
    return links


def expected_link(gpu_list: list[dict[str, Any]], links: dict[str, str]) -> str | None:
    """What a large all-reduce between this node's GPUs can approach, where we know it."""
    if len(gpu_list) < 2:  # no link between GPUs on this node
        return None
    name = gpu_list[0]["name"]
    if links and all(link.startswith("NV") for link in links.values()):
        gbps = next((v for k, v in NVLINK_GBPS.items() if k in name), None)
        return f"NVLink: {gbps} GB/s per GPU one way ({name})" if gbps else "NVLink"
    pcie = nvidia_smi("--query-gpu=pcie.link.gen.max,pcie.link.width.max", "--format=csv,noheader")
    if pcie:
        gen, width = (int(v) for v in pcie.splitlines()[0].split(","))
        gbps = PCIE_LANE_GBPS.get(gen, 0) * width
        return f"PCIe {gen}.0 x{width}: {gbps:.0f} GB/s one way" + (" (no NVLink)" if links else "")
    return None


def backends() -> dict[str, bool]:
    """The process-group backends torch can use here."""
    return {
        "gloo": torch_dist.is_gloo_available(),
        "nccl": torch_dist.is_nccl_available() and torch.cuda.is_available(),
        "mpi": torch_dist.is_mpi_available(),
    }


def port_is_free(port: int) -> bool:
    """True if a rendezvous store could listen on the port (TCPStore also reuses addresses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def all_reduce_bandwidth(device: torch.device) -> list[dict[str, float]]:
    """Time all-reduces of a few sizes; every rank calls it. Times are the slowest rank's."""
    n = torch_dist.get_world_size()
    sizes_kib, iters = (
        ([2**10, 2**14, 2**17], 20) if device.type == "cuda" else ([64, 2**10, 2**13], 5)
    )
    results = []
    for kib in sizes_kib:
        tensor = torch.ones(kib * 256, dtype=torch.float32, device=device)  # 256 floats a KiB
        for _ in range(2):  # warm-up: the first calls connect and allocate
            torch_dist.all_reduce(tensor)
        synchronize(device)
        started = time.perf_counter()
        for _ in range(iters):
            torch_dist.all_reduce(tensor)
        synchronize(device)  # NCCL returns before the work is done: wait for it
        seconds = dist.max_(torch.tensor([(time.perf_counter() - started) / iters])).item()
        algbw = tensor.numel() * 4 / seconds / 1e9
        results.append(
            {
                "bytes": kib * 1024,
                "ms": seconds * 1e3,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (n - 1) / n,
            }
        )
    return results


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs it asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
