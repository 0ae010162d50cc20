"""What share of the datasheet peaks training achieves: ``profiles/efficiency.json`` loaded into
validated models, and the one derived quantity that depends on the workload (matmul utilisation).

What belongs here: the efficiency facts and their loader. What does not: step-time arithmetic
(``advisor.estimate.step_time``), GPU and link peaks (``profiles/gpus.json``, ``interconnects.json``).
"""

from __future__ import annotations

import functools
import json
import statistics

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from profiles import PROFILES_DIR
from advisor.recipes import OptimizerImpl
from advisor.training import Engine

if TYPE_CHECKING:
    from advisor.hardware.catalog import GpuProfile

EFFICIENCY_FILE = PROFILES_DIR / "efficiency.json"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CalibrationRow(_Frozen):
    label: str = Field(description="Published run: model, GPUs, sequence, micro-batch.")
    hidden_size: int = Field(gt=0, description="Model width of that run.")
    tokens_per_micro_batch: int = Field(gt=0, description="Micro-batch x sequence length.")
    published_mfu: float = Field(gt=0, lt=1, description="MFU the source reports (or its throughput gives).")
    published_hfu: float | None = Field(default=None, gt=0, lt=1, description="Hardware FLOPs utilisation (recompute "
                                        "included) of a run that checkpointed; the rule reads it instead of the MFU, "
                                        "since the estimator divides hardware FLOPs by the utilisation.")
    dequantize_share: float = Field(default=0.0, ge=0, lt=1, description="Share of the run's time a 4-bit base's "
                                    "dequantisation took, as the step-time model charges it (bytes / bandwidth): "
                                    "the matmuls ran in the rest.")
    adapter_share: float = Field(default=0.0, ge=0, lt=1, description="Share of the run's time its LoRA adapters' "
                                 "memory traffic took, as the step-time model charges it (advisor.estimate.adapter_time).")

    @property
    def utilisation(self) -> float:
        """What the step-time model's utilisation means for this run: hardware FLOPs over peak, in the
        time the matmuls had (the dequantisation and the adapters' traffic, charged apart, taken out)."""
        published = self.published_hfu if self.published_hfu is not None else self.published_mfu
        return published / (1 - self.dequantize_share - self.adapter_share)


class GpuUtilisation(_Frozen):
    gpus: tuple[str, ...] = Field(description="GPU profile names this fit applies to.")
    max_utilisation: float = Field(gt=0, le=1, description="Matmul utilisation of a large, wide model.")
    source: str
    note: str | None = None
    calibration: tuple[CalibrationRow, ...] = Field(default=(), description="Rows the value is the median of.")
    calibration_gpu: str | None = Field(default=None, description="The GPU profile the rows ran on.")
    calibration_hbm_gbps: float | None = Field(default=None, gt=0, description="That GPU's HBM bandwidth (GB/s, "
                                               "profiles/gpus.json): the other GPUs of the group rescale the blocks' "
                                               "eager elementwise time by theirs (advisor.estimate.bandwidth_time).")


class ComputeEfficiency(_Frozen):
    hidden_half: int = Field(gt=0, description="Width at which the size factor is 1/2.")
    tokens_half: int = Field(gt=0, description="Micro-batch tokens at which the batch factor is 1/2.")
    default_max_utilisation: float = Field(gt=0, le=1, description="For GPUs with no calibration.")
    fp32_max_utilisation: float | None = Field(default=None, gt=0, le=1, description="An fp32 step's utilisation of "
                                               "the fp32 peak before the shape factor, one figure for every GPU (plain "
                                               "fp32 matmuls on the CUDA cores, beside which the elementwise and launch "
                                               "costs inside the bf16 fits weigh little): measured (fp32_source). "
                                               "None: the GPU's own max_utilisation.")
    fp32_source: str | None = None
    source: str
    note: str | None = None
    gpus: tuple[GpuUtilisation, ...]

    def entry(self, gpu_name: str) -> GpuUtilisation | None:
        return next((e for e in self.gpus if gpu_name in e.gpus), None)

    def calibration_bandwidth(self, gpu: GpuProfile) -> float | None:
        """HBM bandwidth (GB/s) of the GPU ``gpu``'s utilisation fit ran on, where it differs from ``gpu``'s own
        (else None): the blocks' eager elementwise time moves with it (``advisor.estimate.bandwidth_time``)."""
        entry = self.entry(gpu.name)
        fitted = entry.calibration_hbm_gbps if entry else None
        return fitted if fitted is not None and fitted != gpu.hbm_bandwidth_gbps else None

    def max_utilisation(self, gpu_name: str) -> float:
        entry = self.entry(gpu_name)
        return entry.max_utilisation if entry else self.default_max_utilisation

    def shape_factor(self, *, hidden_size: int, tokens_per_micro_batch: int) -> float:
        """Narrow models and short micro-batches make small GEMMs, which reach less of the peak."""
        size = hidden_size / (hidden_size + self.hidden_half)
        batch = tokens_per_micro_batch / (tokens_per_micro_batch + self.tokens_half)
        return size * batch

    def utilisation(self, gpu_name: str, *, hidden_size: int, tokens_per_micro_batch: int, rate: str = "bf16") -> float:
        """``rate``: the precision's peak rate (``Precision.peak_rate``); an fp32 step takes ``fp32_max_utilisation``."""
        top = self.fp32_max_utilisation if rate == "fp32" and self.fp32_max_utilisation else self.max_utilisation(gpu_name)
        return top * self.shape_factor(hidden_size=hidden_size, tokens_per_micro_batch=tokens_per_micro_batch)

    def calibrated_max(self, entry: GpuUtilisation) -> float:
        """The documented rule: median over the rows of published MFU (HFU where the run recomputed) / shape factor."""
        return statistics.median(
            r.utilisation / self.shape_factor(hidden_size=r.hidden_size, tokens_per_micro_batch=r.tokens_per_micro_batch)
            for r in entry.calibration
        )


class CommunicationEfficiency(_Frozen):
    intra_node_efficiency: float = Field(gt=0, le=1, description="Achieved / raw GPU-to-GPU bandwidth.")
    inter_node_efficiency: float = Field(gt=0, le=1, description="Achieved / raw NIC bandwidth.")
    overlap_fraction: float = Field(ge=0, le=1, description="Share of compute time comm can hide under.")
    ddp_bucket_bytes: int = Field(gt=0, description="DDP gradient bucket (bucket_cap_mb=25).")
    nic_ports_per_node: dict[str, int] = Field(description="Inter-node link -> NIC ports in a node.")
    source: str
    note: str | None = None

    def nic_ports(self, link: str, gpus_per_node: int) -> int:
        """NIC ports a node drives; one per GPU when unknown, never more than its GPUs."""
        return max(1, min(self.nic_ports_per_node.get(link, gpus_per_node), gpus_per_node))


class OffloadEfficiency(_Frozen):
    pcie_link: dict[str, str] = Field(description="GPU name -> host link (an interconnect name).")
    default_pcie_link: str
    pcie_efficiency: float = Field(gt=0, le=1, description="Achieved / raw PCIe bandwidth.")
    cpu_adam_params_per_s_per_node: dict[Engine, float] = Field(description="CPU optimizer throughput of an engine "
                                                                "with its own CPU kernel (DeepSpeed's CPU-Adam).")
    torch_cpu_adam_params_per_s_per_thread: dict[str, dict[OptimizerImpl, float]] = Field(
        description="torch.optim.AdamW on one CPU thread: state dtype ('fp32', 'bf16') -> implementation -> "
                    "parameters a second (benchmarks/cpu_optimizer.py).")
    torch_cpu_threads_per_process: int = Field(ge=1, description="Threads each process steps with (the launchers' "
                                                                  "OMP_NUM_THREADS).")
    host_memory_gbps: dict[str, float] = Field(description="GPU name -> its node's CPU memory bandwidth (GB/s, peak).")
    default_host_memory_gbps: float = Field(gt=0)
    host_memory_efficiency: float = Field(gt=0, le=1, description="Achieved / peak CPU memory bandwidth.")
    source: str
    note: str | None = None

    def torch_cpu_step_rate(self, *, gpu: str, processes: int, state_bytes: int, implementation: OptimizerImpl) -> float:
        """Parameters a second a node's ``processes`` step together with torch.optim on the CPU: one thread's
        rate times the threads, capped by the node's memory bandwidth over the bytes a parameter's step moves
        (read parameter, gradient and two moments, write three: 7 x ``state_bytes``)."""
        state = "fp32" if state_bytes >= 4 else "bf16"
        threads = processes * self.torch_cpu_threads_per_process
        compute = threads * self.torch_cpu_adam_params_per_s_per_thread[state][implementation]
        return min(compute, self.host_bandwidth_step_rate(gpu=gpu, state_bytes=state_bytes))

    def host_bandwidth_step_rate(self, *, gpu: str, state_bytes: int) -> float:
        """The most parameters a second the node's memory bandwidth lets a CPU AdamW step (7 x ``state_bytes``
        moved a parameter)."""
        bandwidth = self.host_memory_gbps.get(gpu, self.default_host_memory_gbps) * 1e9 * self.host_memory_efficiency
        return bandwidth / (7 * state_bytes)


class OptimizerStepCost(_Frozen):
    hbm_efficiency: float = Field(gt=0, le=1, description="Achieved / datasheet HBM bandwidth.")
    bytes_per_param: dict[str, int] = Field(description="Optimizer -> bytes moved per parameter per step.")
    source: str
    note: str | None = None


class DequantizeCost(_Frozen):
    hbm_efficiency: float = Field(gt=0, le=1, description="Achieved / datasheet HBM bandwidth of the dequantisation kernels.")
    source: str
    note: str | None = None


class LoraAdapterCost(_Frozen):
    hbm_efficiency: float = Field(gt=0, le=1, description="Achieved / datasheet HBM bandwidth of the adapters' "
                                  "memory-bound ops (advisor.estimate.adapter_time).")
    source: str
    note: str | None = None


class WeightCastCost(_Frozen):
    down_hbm_efficiency: float = Field(gt=0, le=1, description="Achieved / datasheet HBM bandwidth of autocast's "
                                       "fp32 -> bf16 weight casts (advisor.estimate.autocast_time).")
    up_hbm_efficiency: float = Field(gt=0, le=1, description="The same for the gradients' bf16 -> fp32 casts back.")
    source: str
    note: str | None = None


class DataParallelPenalty(_Frozen):
    compute_penalty: float = Field(gt=0, le=1, description="Utilisation factor for single-process DP.")
    source: str
    note: str | None = None


class EfficiencyProfile(_Frozen):
    compute: ComputeEfficiency
    communication: CommunicationEfficiency
    offload: OffloadEfficiency
    optimizer_step: OptimizerStepCost
    dequantize: DequantizeCost
    lora_adapters: LoraAdapterCost
    autocast_casts: WeightCastCost
    dataparallel: DataParallelPenalty


@functools.cache
def load_efficiency() -> EfficiencyProfile:
    """The bundled efficiency profile (read once; the file is immutable package data)."""
    raw = json.loads(EFFICIENCY_FILE.read_text())
    raw.pop("_doc", None)
    return EfficiencyProfile(**raw)
