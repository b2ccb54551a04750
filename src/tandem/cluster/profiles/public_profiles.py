"""Profiles for device classes we do not have, DERIVED from public peak numbers by a roofline.

These are not measurements. For each class we take its published peak dense FLOP/s (at the
precision a model would run there) and memory bandwidth, and price one forward call as

    time = max((weight_bytes + kv_bytes) / bandwidth, 2 · params · batch · n / peak_flops) + fixed_ms
    kv_bytes = batch · (context + n) · kv_bytes_per_token

i.e. a step reads every weight and the cached K/V once, and does two FLOPs per parameter per
token; `fixed_ms` stands for kernel launches and host synchronisation (an assumption, not a
spec). Real devices reach a fraction of either peak, so these curves are optimistic in absolute
terms; the planner mostly uses their shape (flat until compute-bound on accelerators, steep on
CPUs) and their ratios. Every profile built here has source "public-spec" and cites its numbers.
"""

from dataclasses import dataclass
from types import MappingProxyType

from tandem.cluster.profiles.model_shapes import model_shape
from tandem.cluster.profiles.profile import Curve, DeviceProfile
from tandem.errors import TandemError

PUBLIC_SIZES = (1, 2, 4, 8, 16, 32, 64)  # n new tokens per sequence
PUBLIC_BATCHES = (1, 2, 4, 8, 16, 32, 64)
PUBLIC_CONTEXTS = (64, 512, 2048)


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    kind: str  # gpu | npu | cpu
    peak_tflops: float  # dense, at the precision listed in `precision`
    bandwidth_gbs: float  # memory bandwidth, GB/s
    memory_gb: float
    fixed_ms: float  # per-call overhead: an assumption, not a spec number
    precision: str  # what peak_tflops counts: "bf16 tensor", "fp32 vector"
    citation: str

    def __post_init__(self):
        if min(self.peak_tflops, self.bandwidth_gbs, self.memory_gb) <= 0 or self.fixed_ms < 0:
            raise TandemError(f"device class {self.name}: peak, bandwidth and memory must be positive")


DEVICE_CLASSES = MappingProxyType({d.name: d for d in (
    # NVIDIA H100 SXM5: 989 TFLOPS dense BF16 tensor (1,979 is the sparse figure), 3.35 TB/s HBM3,
    # 80 GB. Source: NVIDIA H100 Tensor Core GPU datasheet.
    DeviceClass("h100-sxm", "gpu", 989.0, 3350.0, 80.0, 1.0, "bf16 tensor, dense",
                "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 989 TFLOPS dense BF16, 3.35 TB/s HBM3, 80 GB)"),
    # NVIDIA L4: 121 TFLOPS dense FP16 tensor (242 is the sparse figure), 300 GB/s GDDR6, 24 GB.
    # Source: NVIDIA L4 Tensor Core GPU datasheet.
    DeviceClass("l4", "gpu", 121.0, 300.0, 24.0, 1.0, "fp16 tensor, dense",
                "NVIDIA L4 Tensor Core GPU datasheet (121 TFLOPS dense FP16, 300 GB/s GDDR6, 24 GB)"),
    # Huawei Ascend 910B: 280 TFLOPS FP16 as listed by Gitee AI's Ascend 910B cluster docs
    # (ai.gitee.com/docs/compute/clusters_gpu/ascend_gpu), 64 GB HBM2e. Huawei publishes no 910B
    # bandwidth; we use the Ascend 910's 1.2 TB/s HBM2 figure (Huawei, Hot Chips 31, 2019).
    # Third-party reports for the 910B range widely, so treat this class as the roughest here.
    DeviceClass("ascend-910b", "npu", 280.0, 1200.0, 64.0, 2.0, "fp16 cube",
                "Gitee AI Ascend 910B docs (280 TFLOPS FP16, 64 GB HBM2e); bandwidth 1.2 TB/s taken "
                "from the Ascend 910 (Huawei, Hot Chips 31, 2019), no official 910B figure"),
    # AMD EPYC 9654 (one socket): 96 Zen 4 cores at 2.4 GHz base, 12 channels of DDR5-4800 =
    # 460.8 GB/s (AMD product page). Peak FP32 derived: 96 cores x 2.4 GHz x 32 FLOP/cycle
    # (two 256-bit FMA pipes) = 7.37 TFLOPS; llama.cpp's quantised kernels reach far less.
    DeviceClass("epyc-9654", "cpu", 7.37, 460.8, 384.0, 0.2, "fp32 vector, derived",
                "AMD EPYC 9654 product page (96 cores, 2.4 GHz, 12 x DDR5-4800 = 460.8 GB/s); "
                "peak FP32 derived as cores x clock x 32 FLOP/cycle"),
    # Raspberry Pi 5 (an edge CPU): 4 Cortex-A76 cores at 2.4 GHz, 32-bit LPDDR4X-4267 =
    # 17.1 GB/s (Raspberry Pi 5 product brief). Peak FP32 derived: 4 x 2.4 GHz x 16 FLOP/cycle
    # (two 128-bit NEON FMA pipes) = 0.154 TFLOPS.
    DeviceClass("rpi5", "cpu", 0.154, 17.1, 8.0, 0.5, "fp32 vector, derived",
                "Raspberry Pi 5 product brief (4 x Cortex-A76 at 2.4 GHz, LPDDR4X-4267 32-bit = "
                "17.1 GB/s); peak FP32 derived as cores x clock x 16 FLOP/cycle"),
)})


def device_class(name: str) -> DeviceClass:
    try:
        return DEVICE_CLASSES[name]
    except KeyError:
        raise TandemError(f"unknown device class {name!r}; known: {', '.join(DEVICE_CLASSES)}") from None


def roofline_ms(cls: DeviceClass, params: float, weight_bytes: float, kv_bytes_per_token: int,
                batch: int, n: int, context: int) -> float:
    kv_bytes = batch * (context + n) * kv_bytes_per_token
    memory_s = (weight_bytes + kv_bytes) / (cls.bandwidth_gbs * 1e9)
    compute_s = 2 * params * batch * n / (cls.peak_tflops * 1e12)
    return max(memory_s, compute_s) * 1000 + cls.fixed_ms


def public_profile(hardware: str, model: str, backend: str = "torch", dtype: str = "bf16",
                   device: str | None = None) -> DeviceProfile:
    """The derived profile of `model` on device class `hardware` (source: public-spec)."""
    cls, shape = device_class(hardware), model_shape(model)
    weights = shape.weight_bytes(backend, dtype)
    curves = tuple(
        Curve(batch, context, tuple((n, roofline_ms(cls, shape.params, weights, shape.kv_bytes_per_token,
                                                    batch, n, context)) for n in PUBLIC_SIZES))
        for context in PUBLIC_CONTEXTS for batch in PUBLIC_BATCHES
    )
    return DeviceProfile(
        model=model, backend=backend, device=device or cls.kind, dtype=dtype, threads=None,
        source="public-spec", curves=curves,
        citation=f"DERIVED by roofline from {cls.citation}; fixed {cls.fixed_ms} ms per call assumed",
        hardware=cls.name, peak_tflops=cls.peak_tflops, bandwidth_gbs=cls.bandwidth_gbs,
    )
