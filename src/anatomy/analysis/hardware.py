"""Accelerators for the roofline: peak dense FLOP/s per compute dtype and memory bandwidth.

Built-in entries quote the vendor datasheets. NVIDIA's headline tensor-core figures assume 2:4
structured sparsity; the figures here are the dense ones (half the sparse headline), which is
what a transformer's dense matmuls can reach. `local` measures this machine on the spot (an f32
matmul and a memory read); a JSON file supplies the figures of any other device.
"""

from __future__ import annotations

import difflib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from anatomy import dtypes, huge_pages
from anatomy.errors import InputError
from anatomy.text_file import read_text


@dataclass(frozen=True)
class Hardware:
    name: str
    # dense FLOP/s by compute dtype: f32, bf16, f16 (or "any"); int8, amx: the integer products' (a profile's)
    peak_flops: dict[str, float]
    bandwidth: float  # memory bytes/s
    memory_bytes: float | None = None
    source: str = ""
    notes: str = field(default="")

    def peak(self, dtype: str) -> float:
        """Dense peak for the compute dtype (bf16 and f16 share the tensor-core rate)."""
        for key in (dtype, "bf16" if dtype == "f16" else "f16", "any"):
            if key in self.peak_flops:
                return self.peak_flops[key]
        raise InputError(f"hardware {self.name!r} has no peak FLOP/s for {dtype} (has {sorted(self.peak_flops)})")


_SXM_SPARSITY = "dense figures: the datasheet's tensor-core headline (1,979 TFLOP/s bf16) assumes 2:4 sparsity"
BUILTIN = {
    "a100-80gb": Hardware(
        "a100-80gb", {"bf16": 312e12, "f16": 312e12, "f32": 19.5e12}, 2039e9, 80e9,
        source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB): BF16 312 TFLOPS dense (624 with sparsity), "
               "FP32 19.5 TFLOPS, HBM2e 2,039 GB/s",
        notes="dense figures: 624 TFLOP/s bf16 is the 2:4-sparsity headline"),
    "h100-sxm": Hardware(
        "h100-sxm", {"bf16": 989e12, "f16": 989e12, "f32": 67e12}, 3.35e12, 80e9,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS with sparsity = 989 dense, "
               "FP32 67 TFLOPS, HBM3 3.35 TB/s",
        notes=_SXM_SPARSITY),
    "h200": Hardware(
        "h200", {"bf16": 989e12, "f16": 989e12, "f32": 67e12}, 4.8e12, 141e9,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity = 989 dense, "
               "FP32 67 TFLOPS, HBM3e 4.8 TB/s, 141 GB",
        notes=_SXM_SPARSITY),
}


@dataclass(frozen=True)
class Interconnect:
    """The link between the ranks of a tensor- or pipeline-parallel run, for the communication term:
    a collective of M bytes over N ranks costs base + steps * step latency + wire bytes / bandwidth
    (analysis/communication.py), with the bandwidth each rank sends (and receives) at in one direction."""

    name: str
    bandwidth: float  # bytes/s one rank sends at, one direction
    base_latency_s: float  # a collective's fixed start-up cost
    step_latency_s: float  # each step of a ring (or the one step of a send)
    source: str = ""
    notes: str = ""


_NCCL_LATENCY = ("latencies: NCCL's own tuning model (src/graph/tuning.cc): a ring collective costs 3.6 us (LL "
                 "protocol) plus, per ring step, ")
INTERCONNECTS = {
    "nvlink4": Interconnect(
        "nvlink4", 450e9, 3.6e-6, 0.47e-6,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): NVLink 900 GB/s per GPU, both directions together: "
               f"450 GB/s each way (18 fourth-generation links); {_NCCL_LATENCY}0.47 us over NVLink",
        notes="the GPUs of one HGX H100 board, all-to-all through NVSwitch"),
    "pcie5": Interconnect(
        "pcie5", 64e9, 3.6e-6, 1.0e-6,
        source="PCI Express 5.0 x16: 32 GT/s x 16 lanes = 64 GB/s each way before encoding (NVIDIA H100 PCIe "
               f"datasheet: PCIe Gen5 128 GB/s, both directions); {_NCCL_LATENCY}1.0 us over PCI",
        notes="GPUs without NVLink: every byte crosses the PCIe switch"),
    "ib-ndr400": Interconnect(
        "ib-ndr400", 50e9, 3.6e-6, 2.7e-6,
        source="InfiniBand NDR 400 Gb/s (NVIDIA ConnectX-7), one adapter per GPU: 50 GB/s each way; "
               f"{_NCCL_LATENCY}2.7 us over the network",
        notes="ranks on different machines (as a DGX H100 cluster's compute fabric)"),
}
INTERCONNECT_ALIASES = {"nvlink": "nvlink4", "nvlink-4": "nvlink4", "pcie": "pcie5", "pcie-5": "pcie5",
                        "infiniband": "ib-ndr400", "ib": "ib-ndr400", "ib400": "ib-ndr400", "400g-ib": "ib-ndr400"}


def get_interconnect(name: str) -> Interconnect:
    """A named interconnect (or an alias: nvlink, pcie, infiniband)."""
    key = INTERCONNECT_ALIASES.get(name.lower(), name.lower())
    if key in INTERCONNECTS:
        return INTERCONNECTS[key]
    close = difflib.get_close_matches(name, [*INTERCONNECTS, *INTERCONNECT_ALIASES], n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise InputError(f"unknown --interconnect {name!r}{hint} (choose from {', '.join(INTERCONNECTS)})")


def hardware_names() -> list[str]:
    return [*BUILTIN, "local", "FILE.json"]


def get_hardware(name: str) -> Hardware:
    """A built-in entry, `local` (measured now), or a JSON file path."""
    if name in BUILTIN:
        return BUILTIN[name]
    if name == "local":
        return measure_local()
    if name.endswith(".json") or Path(name).is_file():
        return load_hardware_json(Path(name))
    close = difflib.get_close_matches(name, [*BUILTIN, "local"], n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise InputError(f"unknown hardware {name!r}{hint} (choose from {', '.join(hardware_names())})")


def load_hardware_json(path: Path) -> Hardware:
    """{"name": ..., "peak_flops": number or {"bf16": ..., "f32": ...}, "bandwidth": bytes/s,
    "memory_bytes": optional}; peak figures are dense FLOP/s, keyed by compute dtype (f32, f16, bf16)."""
    if not path.is_file():
        raise InputError(f"hardware file {path} does not exist")
    try:
        data = json.loads(read_text(path, label="hardware file"))
    except json.JSONDecodeError as exc:
        raise InputError(f"hardware file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"hardware file {path} must hold a JSON object")
    peak = data.get("peak_flops")
    if isinstance(peak, (int, float)) and not isinstance(peak, bool):
        peak = {"any": peak}
    if not isinstance(peak, dict) or not peak:
        raise InputError(f"hardware file {path} has no peak figures: field 'peak_flops' (dense FLOP/s, a number "
                         "or {\"bf16\": ..., \"f32\": ...}) is required")
    peaks = {_peak_key(k, path): _positive(v, path, f"peak_flops.{k}") for k, v in peak.items()}
    bandwidth = _positive(data.get("bandwidth"), path, "bandwidth")
    memory = data.get("memory_bytes")
    return Hardware(str(data.get("name", path.stem)), peaks, bandwidth,
                    _positive(memory, path, "memory_bytes") if memory is not None else None, source=str(path))


def _peak_key(key: str, path: Path) -> str:
    """A compute dtype (old spellings such as "fp32" still read, with a deprecation note), or "any"."""
    return key if key == "any" else dtypes.parse(key, option=f"hardware file {path}: peak_flops key").name


def _positive(value: object, path: Path, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InputError(f"hardware file {path}: field {name!r} must be a positive number, got {value!r}")
    return float(value)


def measure_local(*, matmul_n: int = 1024, read_mib: int = 256, repeats: int = 3,
                  compute_dtypes: tuple[str, ...] = ("f32",)) -> Hardware:
    """This machine, measured now: best of `repeats` matmuls [n, n] @ [n, n] (2n^3 FLOPs) in each
    of `compute_dtypes` and best of `repeats` sums over a read_mib MiB f32 tensor (bytes read / seconds)."""
    cpu = torch.device("cpu")
    peaks = {d: measure_matmul_peak(cpu, size=matmul_n, repeats=repeats, dtype=dtypes.torch_dtype(d))
             for d in compute_dtypes}
    x = torch.ones(read_mib * 2 ** 20 // 4)
    # on 2 MiB pages where the system gives them, as the engine's layouts lie: on 4 KiB pages the sum is
    # bound by the TLB, below what a decode step streams
    huge = huge_pages.hold([x], large=x.nbytes + 1) > 0
    bandwidth = x.nbytes / _best_seconds(lambda: x.sum(), repeats, cpu)
    first = peaks[compute_dtypes[0]]
    only = compute_dtypes == ("f32",)
    return Hardware("local", {**peaks, "any": first}, bandwidth, source=(
        f"measured now: {'/'.join(compute_dtypes)} matmul {matmul_n}^3 and a sum over {read_mib} MiB"
        f"{' on 2 MiB pages' if huge else ''}, best of {repeats}"),
        notes="f32 only: this measurement stands in for every compute dtype" if only else "")


def measure_matmul_peak(device: torch.device, *, size: int = 1024, repeats: int = 3,
                        dtype: torch.dtype | None = None) -> float:
    """FLOP/s of the best of `repeats` [size, size] matmuls (default fp32; bf16 on a GPU) with this
    process's threads. Its own generator draws the inputs: the global RNG (dropout, sampling) is untouched."""
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    gen = torch.Generator(device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    return 2.0 * size ** 3 / _best_seconds(lambda: a @ b, repeats, device)


# a kernel's integer products (kernels/candidates.py `products`) -> the roof they run under. int16 products
# take the int8 one: a pass's rows far from a sampled one run the plan's int8 kernel (sampled_rows.py), so a
# product planned on int16 may run at up to the int8 rate, which no int16 roof would bound
INTEGER_PRODUCTS = {"int8": "int8", "int16": "int8", "amx": "amx"}
INTEGER_ROOFS = frozenset(INTEGER_PRODUCTS.values())  # their names among a Hardware's peak_flops


def measure_integer_peaks(*, repeats: int = 3) -> dict[str, float]:
    """This CPU's roofs for anatomy's integer products, FLOP/s at 2 a multiply-add: "int8", AVX-512 VNNI's
    int8 multiply-add alone on every thread (anatomy::integer_peak); "amx", anatomy's q8 tiles on AMX at 256
    rows of [2048, 2048]: that kernel's best measured rate, not an instruction's (no AMX peak is measured
    apart from it). Only those this CPU runs."""
    from anatomy.kernels import native

    peaks = {}
    if native.loaded() and native.runs("avx512-vnni"):
        peaks["int8"] = 2 * max(torch.ops.anatomy.integer_peak(100_000) for _ in range(repeats))
    if native.loaded() and native.runs("amx"):
        gen = torch.Generator().manual_seed(0)
        codes = torch.randint(-127, 128, (2048, 2048), dtype=torch.int8, generator=gen)
        tiles = torch.ops.anatomy.pack_q8_tiles(codes, torch.full((2048, 64), 1e-2))
        x = torch.randn(256, 2048, generator=gen)
        seconds = _best_seconds(lambda: torch.ops.anatomy.tiles_amx_linear(x, tiles), repeats, torch.device("cpu"))
        peaks["amx"] = 2.0 * 256 * 2048 * 2048 / seconds
    return peaks


def _best_seconds(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm up
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
