"""The simulated machines: public figures of Ascend-class tile accelerators."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..errors import PyptoError

# DMA bandwidth per core and path, GiB/s (public figures of the a2a3 / 910B class).
A2A3_BANDWIDTH = {
    ("GM", "UB"): 100.9, ("GM", "L1"): 135.0, ("UB", "GM"): 188.46, ("L1", "L0A"): 441.0,
    ("L1", "L0B"): 220.5, ("L0C", "GM"): 70.0, ("L0C", "L1"): 128.0, ("UB", "UB"): 1024.0,
}


@dataclass(frozen=True)
class Machine:
    name: str
    n_aic: int
    n_aiv: int
    clock_ghz: float
    ub_kib: int
    l1_kib: int
    l0a_kib: int
    l0b_kib: int
    l0c_kib: int
    hbm_gbps: float                   # shared by all cores, GB/s (10^9 bytes)
    bandwidth_gibps: dict = field(default_factory=lambda: dict(A2A3_BANDWIDTH))
    vec_head: int = 12                # cycles before the first repeat of a vector instruction
    vec_tail: int = 16                # cycles to drain the last repeat
    vec_repeat_bytes: int = 256
    cube_startup: int = 6
    dispatch_cycles: int = 100        # task launch overhead on a core

    def __hash__(self):
        return hash((self.name, self.n_aic, self.n_aiv, self.clock_ghz, self.ub_kib, self.hbm_gbps))

    def capacities(self) -> dict[str, int]:
        return {"UB": self.ub_kib * 1024, "L1": self.l1_kib * 1024, "L0A": self.l0a_kib * 1024,
                "L0B": self.l0b_kib * 1024, "L0C": self.l0c_kib * 1024}

    def replace(self, **changes) -> "Machine":
        return dataclasses.replace(self, **changes)

    @property
    def hbm_bytes_per_cycle(self) -> float:
        return self.hbm_gbps * 1e9 / (self.clock_ghz * 1e9)

    def dma_bytes_per_cycle(self, src: str, dst: str) -> float:
        return self.bandwidth_gibps[(src, dst)] * 2 ** 30 / (self.clock_ghz * 1e9)

    def cycles_to_us(self, cycles: float) -> float:
        return cycles / (self.clock_ghz * 1e3)

    @property
    def peak_flops(self) -> float:
        return self.n_aic * 16 * 16 * 16 * 2 * self.clock_ghz * 1e9


A2A3 = Machine("a2a3", n_aic=24, n_aiv=48, clock_ghz=1.85, ub_kib=192, l1_kib=512, l0a_kib=64,
               l0b_kib=64, l0c_kib=128, hbm_gbps=1600.0)
# A small machine with the same per-core rules: 2 cube + 4 vector cores, a quarter of the HBM,
# so that tutorial timelines stay readable.
TEACH = A2A3.replace(name="teach", n_aic=2, n_aiv=4, hbm_gbps=400.0)

MACHINES = {m.name: m for m in (A2A3, TEACH)}


def get_machine(machine) -> Machine:
    if isinstance(machine, Machine):
        return machine
    try:
        return MACHINES[machine]
    except KeyError:
        raise PyptoError("unknown machine", expected=" or ".join(repr(k) for k in MACHINES),
                         got=repr(machine)) from None
