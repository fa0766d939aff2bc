"""The simulated machines: public figures of Ascend-class tile accelerators.

A `Machine` is a frozen dataclass; `machine.replace(ub_kib=256)` makes a variant, and a TOML
file with the same fields makes a new one (`Machine.from_toml(path)`, `load_machine(path)`):

    # my_machine.toml
    base = "a2a3"              # start from a built-in machine (or another .toml file) ...
    name = "a2a3-bigub"
    ub_kib = 256               # ... and override only some fields
    [bandwidth_gibps]
    "GM->UB" = 120.0

Without `base` every field without a default must be given.  Every value is checked (type,
sign), unknown fields are reported with the list of valid ones.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

from ..errors import PyptoError, at_caller


# DMA bandwidth per core and path, GiB/s (public figures of the a2a3 / 910B class).
A2A3_BANDWIDTH = {
    ("GM", "UB"): 100.9, ("GM", "L1"): 135.0, ("UB", "GM"): 188.46, ("L1", "L0A"): 441.0,
    ("L1", "L0B"): 220.5, ("L0C", "GM"): 70.0, ("L0C", "L1"): 128.0, ("UB", "UB"): 1024.0,
    # L1 -> bias table: no public figure; assumed to move as fast as L1 -> L0B (same MTE1 pipe)
    ("L1", "BT"): 220.5,
}
SPACES = ("GM", "UB", "L1", "L0A", "L0B", "L0C", "BT")


@dataclass(frozen=True)
class Machine:
    name: str
    n_aic: int                        # cube cores
    n_aiv: int                        # vector cores
    clock_ghz: float
    ub_kib: int                       # per AIV
    l1_kib: int                       # per AIC
    l0a_kib: int
    l0b_kib: int
    l0c_kib: int
    hbm_gbps: float                   # shared by all cores, GB/s (10^9 bytes)
    bandwidth_gibps: dict = field(default_factory=lambda: dict(A2A3_BANDWIDTH))  # per core and path
    bt_kib: int = 1                   # bias table per AIC: the bias row TMATMUL_BIAS starts from
    vec_head: int = 12                # cycles before the first repeat of a vector instruction
    vec_tail: int = 16                # cycles to drain the last repeat
    vec_repeat_bytes: int = 256
    cube_startup: int = 6
    dispatch_cycles: int = 100        # task launch overhead on a core
    # L2 cache shared by all cores (public: CANN PyPTO cost model CacheConfig.toml gives
    # 512-byte lines, 50-cycle hit latency, +150 cycles on a miss; 910B L2 is 192 MiB).
    l2_mib: int = 192                 # 0 = no L2 cache
    l2_line_bytes: int = 512
    l2_hit_cycles: int = 50
    l2_miss_extra_cycles: int = 150
    # L2 read bandwidth shared by all cores, GB/s: CANN's A2A3 platform file gives ~110 bytes
    # read from L2 per core and cycle: 24 cores x 110 B x 1.85 GHz = 4884 GB/s (~4.9 TB/s).
    l2_gbps: float = 4884.0
    # Which cost rules the instructions follow (`pypto.target.cost`): "calibrated" fits hardware-
    # measured cycles of single instructions on an A2/A3 core (docs/cost_model.md), "public" is
    # the plain public formulas (every vector op head + slope x repeats + tail, GM at the path's
    # bandwidth).  The two fields below are read by the calibrated rules only.
    cost_model: str = "calibrated"
    # calibrated GM loads (GM -> UB / L1): each 2-D DMA of a load (one per index of the window's
    # dims before the last two) costs this many cycles before its bytes move, at the peak below;
    # a lone cold load takes DMAs x burst + bytes / peak, its L2 miss latency included
    dma_burst_cycles: int = 264
    gm_load_peak_gibps: float = 220.55   # about 128 bytes per cycle at 1.85 GHz

    def __post_init__(self):
        bw = {}
        for k, v in dict(self.bandwidth_gibps).items():
            bw[_path_key(k, "bandwidth_gibps")] = v
        object.__setattr__(self, "bandwidth_gibps", bw)
        for f in dataclasses.fields(self):
            v = _check_field(f.name, getattr(self, f.name))
            object.__setattr__(self, f.name, v)

    def __hash__(self):
        return hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "bandwidth_gibps")
                    + (tuple(sorted(self.bandwidth_gibps.items())),))

    def capacities(self) -> dict[str, int]:
        return {"UB": self.ub_kib * 1024, "L1": self.l1_kib * 1024, "L0A": self.l0a_kib * 1024,
                "L0B": self.l0b_kib * 1024, "L0C": self.l0c_kib * 1024, "BT": self.bt_kib * 1024}

    @at_caller
    def replace(self, **changes) -> "Machine":
        unknown = [k for k in changes if k not in FIELDS]
        if unknown:
            raise PyptoError(f"unknown machine field '{unknown[0]}'", expected="one of " + ", ".join(FIELDS),
                             got=unknown[0])
        return dataclasses.replace(self, **changes)

    @property
    def hbm_bytes_per_cycle(self) -> float:
        return self.hbm_gbps * 1e9 / (self.clock_ghz * 1e9)

    @property
    def l2_bytes_per_cycle(self) -> float:
        return self.l2_gbps * 1e9 / (self.clock_ghz * 1e9)

    @property
    def l2_bytes(self) -> int:
        return self.l2_mib * 2 ** 20

    def dma_bytes_per_cycle(self, src: str, dst: str) -> float:
        try:
            bw = self.bandwidth_gibps[(src, dst)]
        except KeyError:
            raise PyptoError(f"machine {self.name} has no data path {src}->{dst}",
                             expected=" or ".join(f"{s}->{d}" for s, d in self.bandwidth_gibps),
                             got=f"{src}->{dst}") from None
        return bw * 2 ** 30 / (self.clock_ghz * 1e9)

    def gm_load_bytes_per_cycle(self, src: str, dst: str) -> float:
        """The bandwidth a GM load (or store) moves its bytes at: the path's figure, or under the
        calibrated rules the measured load peak (GM -> UB / L1)."""
        if self.cost_model == "calibrated" and src == "GM":
            return self.gm_load_peak_gibps * 2 ** 30 / (self.clock_ghz * 1e9)
        return self.dma_bytes_per_cycle(src, dst)

    def cycles_to_us(self, cycles: float) -> float:
        return cycles / (self.clock_ghz * 1e3)

    @property
    def peak_flops(self) -> float:
        return self.n_aic * 16 * 16 * 16 * 2 * self.clock_ghz * 1e9

    # --- files ------------------------------------------------------------------------
    @classmethod
    @at_caller
    def from_toml(cls, path) -> "Machine":
        """A machine described by a TOML file (see the module docstring)."""
        return _from_toml(os.fspath(path), ())

    @classmethod
    @at_caller
    def from_dict(cls, data: dict, *, where: str = "machine description", base_dir: str = ".") -> "Machine":
        """A machine from a mapping with the TOML file's keys (`base`, fields, `bandwidth_gibps`)."""
        return _from_dict(dict(data), where, base_dir, ())

    def to_toml(self) -> str:
        """The machine as a TOML file that `Machine.from_toml` reads back to an equal machine."""
        lines = [f"# pypto machine {self.name}"]
        for f in dataclasses.fields(self):
            if f.name == "bandwidth_gibps":
                continue
            v = getattr(self, f.name)
            lines.append(f'{f.name} = "{v}"' if isinstance(v, str) else f"{f.name} = {v!r}")
        lines.append("")
        lines.append("[bandwidth_gibps]   # per core and path, GiB/s")
        for (s, d), v in self.bandwidth_gibps.items():
            lines.append(f'"{s}->{d}" = {float(v)!r}')
        return "\n".join(lines) + "\n"


FIELDS = tuple(f.name for f in dataclasses.fields(Machine))
REQUIRED = tuple(f.name for f in dataclasses.fields(Machine)
                 if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
_FLOAT_FIELDS = ("clock_ghz", "hbm_gbps", "l2_gbps", "gm_load_peak_gibps")
COST_MODELS = ("calibrated", "public")
# fields that may be 0 (an overhead that can be switched off; l2_mib = 0: no L2 cache)
_ZERO_OK = ("vec_head", "vec_tail", "cube_startup", "dispatch_cycles", "l2_mib", "l2_hit_cycles",
            "l2_miss_extra_cycles", "dma_burst_cycles")


def _path_key(k, what: str) -> tuple[str, str]:
    if isinstance(k, str):
        parts = [p.strip() for p in k.split("->")]
    else:
        parts = list(k) if isinstance(k, (tuple, list)) else [k]
    if len(parts) != 2 or any(p not in SPACES for p in parts) or parts[0] == parts[1] == "GM":
        raise PyptoError(f"machine field '{what}': bad data path {k!r}",
                         expected='a path "SRC->DST" between ' + ", ".join(SPACES) + ' (e.g. "GM->UB")',
                         got=repr(k))
    return parts[0], parts[1]


def _check_field(name: str, v):
    """The value, checked (and ints of float fields made floats); a PyptoError naming the field."""
    if name == "name":
        if not isinstance(v, str) or not v:
            raise PyptoError("machine field 'name' must be a non-empty string", expected="a string", got=repr(v))
        return v
    if name == "cost_model":
        if v not in COST_MODELS:
            raise PyptoError("machine field 'cost_model' must name a cost model",
                             expected=" or ".join(repr(c) for c in COST_MODELS), got=repr(v))
        return v
    if name == "bandwidth_gibps":
        for k, bw in v.items():
            what = f"bandwidth_gibps[\"{k[0]}->{k[1]}\"]"
            if isinstance(bw, bool) or not isinstance(bw, (int, float)):
                raise PyptoError(f"machine field '{what}' must be a number (GiB/s)", expected="a number > 0",
                                 got=repr(bw))
            if not (bw > 0 and math.isfinite(bw)):
                raise PyptoError(f"machine field '{what}' must be positive", expected="a number > 0", got=bw)
            v[k] = float(bw)
        return v
    low = 0 if name in _ZERO_OK else 1
    if name in _FLOAT_FIELDS:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise PyptoError(f"machine field '{name}' must be a number", expected="a number > 0", got=repr(v))
        if not (v > 0 and math.isfinite(v)):
            raise PyptoError(f"machine field '{name}' must be positive", expected="a number > 0", got=v)
        return float(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise PyptoError(f"machine field '{name}' must be an integer",
                         expected=f"an integer >= {low}", got=repr(v))
    if v < low:
        raise PyptoError(f"machine field '{name}' must be {'positive' if low else 'zero or positive'}",
                         expected=f"an integer >= {low}", got=v)
    return v


def _load_toml(path: str) -> dict:
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise PyptoError("reading a machine file needs Python >= 3.11 (tomllib) or the tomli package") from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise PyptoError(f"machine file {path} not found", expected="an existing .toml file or a machine name",
                         got=path) from None
    except tomllib.TOMLDecodeError as e:
        raise PyptoError(f"machine file {path} is not valid TOML", expected="TOML: key = value lines, "
                         "strings in quotes, [bandwidth_gibps] table", got=str(e),
                         hint='e.g.  base = "a2a3"  then  ub_kib = 256') from None


def _from_toml(path: str, seen: tuple) -> Machine:
    if os.path.abspath(path) in seen:
        raise PyptoError(f"machine file {path}: 'base' files form a cycle",
                         got=" -> ".join(seen + (os.path.abspath(path),)))
    data = _load_toml(path)
    data.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    return _from_dict(data, f"machine file {path}", os.path.dirname(os.path.abspath(path)),
                      seen + (os.path.abspath(path),))


def _from_dict(data: dict, where: str, base_dir: str, seen: tuple) -> Machine:
    base = data.pop("base", None)
    unknown = [k for k in data if k not in FIELDS]
    if unknown:
        import difflib
        close = difflib.get_close_matches(unknown[0], FIELDS, n=1)
        raise PyptoError(f"{where}: unknown field '{unknown[0]}'",
                         expected="one of base, " + ", ".join(FIELDS), got=", ".join(unknown),
                         hint=f"did you mean '{close[0]}'?" if close else None)
    if "bandwidth_gibps" in data and not isinstance(data["bandwidth_gibps"], dict):
        raise PyptoError(f"{where}: field 'bandwidth_gibps' must be a table of paths",
                         expected='[bandwidth_gibps] with keys like "GM->UB"', got=repr(data["bandwidth_gibps"]))
    try:
        if base is not None:
            if not isinstance(base, str):
                raise PyptoError(f"{where}: field 'base' must be a machine name or a .toml path",
                                 expected=" or ".join(repr(k) for k in MACHINES), got=repr(base))
            if base in MACHINES:
                parent = MACHINES[base]
            else:
                p = base if os.path.isabs(base) else os.path.join(base_dir, base)
                if not p.endswith(".toml") or not os.path.exists(p):
                    raise PyptoError(f"{where}: unknown base machine {base!r}",
                                     expected=" or ".join(repr(k) for k in MACHINES) + " or a .toml file",
                                     got=repr(base))
                parent = _from_toml(p, seen)
            changes = dict(data)
            if "bandwidth_gibps" in changes:
                bw = dict(parent.bandwidth_gibps)
                for k, v in changes["bandwidth_gibps"].items():
                    bw[_path_key(k, "bandwidth_gibps")] = v
                changes["bandwidth_gibps"] = bw
            return dataclasses.replace(parent, **changes)
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise PyptoError(f"{where}: missing field '{missing[0]}' (give every field, or 'base = \"a2a3\"' "
                             "to start from a built-in machine)",
                             expected="all of " + ", ".join(REQUIRED), got="missing " + ", ".join(missing))
        if "bandwidth_gibps" in data:
            bw = {_path_key(k, "bandwidth_gibps"): v for k, v in data["bandwidth_gibps"].items()}
            absent = [f"{s}->{d}" for s, d in A2A3_BANDWIDTH if (s, d) not in bw]
            if absent:
                raise PyptoError(f"{where}: field 'bandwidth_gibps' misses data paths (without 'base' "
                                 "every path needs a bandwidth)", expected=", ".join(
                                     f"{s}->{d}" for s, d in A2A3_BANDWIDTH), got="missing " + ", ".join(absent))
            data["bandwidth_gibps"] = bw
        return Machine(**data)
    except PyptoError as e:
        if e.message.startswith(where):
            raise
        raise PyptoError(f"{where}: {e.message}", loc=e.loc, expected=e.expected, got=e.got, hint=e.hint) from None


A2A3 = Machine("a2a3", n_aic=24, n_aiv=48, clock_ghz=1.85, ub_kib=192, l1_kib=512, l0a_kib=64,
               l0b_kib=64, l0c_kib=128, hbm_gbps=1600.0)
# A small machine with the same per-core rules: 2 cube + 4 vector cores, a quarter of the HBM
# (and of the L2 bandwidth), so that tutorial timelines stay readable.
# It keeps the public cost formulas, whose numbers a student can work out by hand.
TEACH = A2A3.replace(name="teach", n_aic=2, n_aiv=4, hbm_gbps=400.0, l2_gbps=1221.0, cost_model="public")
# Ascend 950-class "a5" (public figures): 32 AIC + 64 AIV at 1.65 GHz; UB 256 KiB per AIV and
# L0C 256 KiB per AIC (CANN ops-transformer gmm arch.h: L0C_SIZE = 256 KiB for Ascend910_95,
# __NPU_ARCH__ 3101; L0A/L0B 64 KiB and L1 512 KiB as a2a3).  HBM 1.6 TB/s (Huawei's announced
# figure for the 950PR; the 950DT's is 4 TB/s).  Per-path DMA bandwidths, vector and cube
# timings and the L2 size/latencies as a2a3 (no public figures found); L2 bandwidth from the
# same 110 bytes per core and cycle: 32 x 110 B x 1.65 GHz = 5808 GB/s.
# The calibration measured an A2/A3 core: a5 keeps the public formulas.
A5 = A2A3.replace(name="a5", n_aic=32, n_aiv=64, clock_ghz=1.65, ub_kib=256, l0c_kib=256,
                  hbm_gbps=1600.0, l2_gbps=5808.0, cost_model="public")

MACHINES = {m.name: m for m in (A2A3, TEACH, A5)}


@at_caller
def load_machine(path_or_name) -> Machine:
    """A built-in machine by name, or a machine described by a .toml file."""
    if isinstance(path_or_name, Machine):
        return path_or_name
    if isinstance(path_or_name, str) and path_or_name in MACHINES:
        return MACHINES[path_or_name]
    if isinstance(path_or_name, (str, os.PathLike)):
        p = os.fspath(path_or_name)
        if p.endswith(".toml") or os.path.isfile(p):
            return Machine.from_toml(p)
    hint = None
    if isinstance(path_or_name, str):
        import difflib
        close = difflib.get_close_matches(path_or_name.lower(), list(MACHINES), n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}?" if close else None
    raise PyptoError("unknown machine", expected=" or ".join(repr(k) for k in MACHINES) + " or a .toml file",
                     got=repr(path_or_name), hint=hint)


def get_machine(machine) -> Machine:
    """A Machine, a built-in machine's name, or the path of a .toml machine file -> Machine."""
    return load_machine(machine)
