"""Instance types: SageMaker ``ml.*`` names mapped to CPUs, memory and GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from shoal.errors import InvalidArgumentError

__all__ = ["INSTANCE_TYPES", "InstanceType", "resolve_instance_type"]


@dataclass(frozen=True, slots=True)
class InstanceType:
    name: str
    cpus: int
    memory_gib: float
    gpus: int = 0


def _table() -> dict[str, InstanceType]:
    sizes = {"large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32,
             "12xlarge": 48, "16xlarge": 64, "24xlarge": 96}
    table: dict[str, InstanceType] = {}
    # (family, GiB per vCPU)
    for family, gib_per_cpu in (("t3", 4.0), ("m5", 4.0), ("m6i", 4.0), ("m7i", 4.0),
                                ("c5", 2.0), ("c6i", 2.0), ("c7i", 2.0),
                                ("r5", 8.0), ("r6i", 8.0)):
        for size, cpus in sizes.items():
            table[f"ml.{family}.{size}"] = InstanceType(f"ml.{family}.{size}", cpus,
                                                        cpus * gib_per_cpu)
    for name in ("ml.t3.medium",):
        table[name] = InstanceType(name, 2, 4.0)
    for name, cpus, mem, gpus in (
        ("ml.g4dn.xlarge", 4, 16, 1), ("ml.g4dn.2xlarge", 8, 32, 1), ("ml.g4dn.12xlarge", 48, 192, 4),
        ("ml.g5.xlarge", 4, 16, 1), ("ml.g5.2xlarge", 8, 32, 1), ("ml.g5.12xlarge", 48, 192, 4),
        ("ml.g5.48xlarge", 192, 768, 8), ("ml.p3.2xlarge", 8, 61, 1), ("ml.p3.8xlarge", 32, 244, 4),
        ("ml.p4d.24xlarge", 96, 1152, 8), ("ml.p5.48xlarge", 192, 2048, 8),
        ("ml.g6.xlarge", 4, 16, 1), ("ml.g6.12xlarge", 48, 192, 4),
    ):
        table[name] = InstanceType(name, cpus, float(mem), gpus)
    return table


INSTANCE_TYPES: dict[str, InstanceType] = _table()


def resolve_instance_type(name: str) -> InstanceType:
    """Look up *name*; ``local`` and ``local_gpu`` stand for this machine as it is."""
    if name in ("local", "local_gpu"):
        return InstanceType(name, 0, 0.0, 1 if name == "local_gpu" else 0)
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        close = sorted(n for n in INSTANCE_TYPES if n.split(".")[1:2] == name.split(".")[1:2])
        hint = f" Known types of that family: {', '.join(close[:6])}." if close else ""
        raise InvalidArgumentError(
            f"unknown instance_type {name!r}.{hint} Use an ml.* type such as 'ml.m5.large', "
            "or 'local' for this machine as it is.", instance_type=name,
        ) from None
