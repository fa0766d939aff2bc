"""Machines: the public figures, variants, TOML machine files and their validation."""
from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest

import pypto
from pypto.target.machine import A2A3, A5, MACHINES, TEACH, Machine, get_machine, load_machine

GIB = 2 ** 30


# ---------------------------------------------------------------------------------------
# built-in machines

def test_a2a3_figures():
    m = A2A3
    assert (m.n_aic, m.n_aiv, m.clock_ghz) == (24, 48, 1.85)
    assert m.capacities() == {"UB": 192 * 1024, "L1": 512 * 1024, "L0A": 64 * 1024, "L0B": 64 * 1024,
                              "L0C": 128 * 1024, "BT": 1024}     # DESIGN.md: bias table 1 KiB
    assert m.hbm_gbps == 1600.0
    assert m.bandwidth_gibps == {("GM", "UB"): 100.9, ("GM", "L1"): 135.0, ("UB", "GM"): 188.46,
                                 ("L1", "L0A"): 441.0, ("L1", "L0B"): 220.5, ("L0C", "GM"): 70.0,
                                 ("L0C", "L1"): 128.0, ("UB", "UB"): 1024.0,
                                 ("L1", "BT"): 220.5}     # no public figure: assumed as L1 -> L0B


def test_l2_description():
    m = A2A3
    assert (m.l2_mib, m.l2_line_bytes, m.l2_hit_cycles, m.l2_miss_extra_cycles) == (192, 512, 50, 150)
    assert m.l2_bytes == 192 * 2 ** 20
    # ~110 bytes read from L2 per core and cycle: 24 x 110 B x 1.85 GHz ~ 4.9 TB/s, shared by all cores
    assert m.l2_gbps == pytest.approx(24 * 110 * 1.85, rel=0.01)
    assert m.l2_bytes_per_cycle == pytest.approx(24 * 110, rel=0.01)
    # L2 is faster than HBM (DESIGN: ~32 B/core/cycle from DDR, ~110 B/core/cycle from L2)
    assert m.l2_gbps > 3 * m.hbm_gbps
    for mm in MACHINES.values():
        assert mm.l2_gbps > mm.hbm_gbps
        assert mm.l2_line_bytes == 512


def test_a5_figures():
    assert "a5" in MACHINES and MACHINES["a5"] is A5
    assert get_machine("a5") is A5
    assert (A5.n_aic, A5.n_aiv) == (32, 64)
    assert A5.clock_ghz == 1.65
    assert A5.ub_kib == 256 and A5.l0c_kib == 256
    assert A5.capacities()["UB"] == 256 * 1024 and A5.capacities()["L0C"] == 256 * 1024
    # other per-core figures as a2a3
    assert (A5.l1_kib, A5.l0a_kib, A5.l0b_kib) == (512, 64, 64)
    assert A5.bandwidth_gibps == A2A3.bandwidth_gibps
    assert A5.l2_gbps == pytest.approx(32 * 110 * 1.65, rel=0.01)
    assert A5.peak_flops == pytest.approx(32 * 16 ** 3 * 2 * 1.65e9)
    # the same GiB/s per path at a slower clock: more bytes per cycle
    assert A5.dma_bytes_per_cycle("GM", "UB") == pytest.approx(100.9 * GIB / 1.65e9)
    assert A5.dma_bytes_per_cycle("GM", "UB") > A2A3.dma_bytes_per_cycle("GM", "UB")


def test_teach_and_machines_dict():
    assert set(MACHINES) == {"a2a3", "teach", "a5"}
    assert TEACH.capacities() == A2A3.capacities()
    assert (TEACH.n_aic, TEACH.n_aiv) == (2, 4)


def test_machine_is_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        A2A3.ub_kib = 1
    assert len({A2A3, TEACH, A5, A2A3.replace()}) == 3
    assert A2A3.replace() == A2A3 and hash(A2A3.replace()) == hash(A2A3)
    big = A2A3.replace(ub_kib=256)
    assert big != A2A3 and hash(big) != hash(A2A3)


def test_replace_makes_variants():
    m = A2A3.replace(name="big-ub", ub_kib=384, l2_mib=0)
    assert m.capacities()["UB"] == 384 * 1024 and m.l2_mib == 0
    assert A2A3.ub_kib == 192                          # the original is untouched
    m2 = A2A3.replace(bandwidth_gibps={"GM->UB": 200.0, ("UB", "GM"): 300})
    assert m2.bandwidth_gibps == {("GM", "UB"): 200.0, ("UB", "GM"): 300.0}
    assert m2.dma_bytes_per_cycle("GM", "UB") == pytest.approx(200 * GIB / 1.85e9)
    with pytest.raises(pypto.PyptoError, match="no data path GM->L1"):
        m2.dma_bytes_per_cycle("GM", "L1")


@pytest.mark.parametrize("change, field", [
    ({"ub_kib": -1}, "ub_kib"), ({"ub_kib": 0}, "ub_kib"), ({"n_aic": 2.5}, "n_aic"),
    ({"clock_ghz": 0}, "clock_ghz"), ({"clock_ghz": "fast"}, "clock_ghz"), ({"n_aiv": True}, "n_aiv"),
    ({"hbm_gbps": -5.0}, "hbm_gbps"), ({"vec_head": -1}, "vec_head"), ({"name": ""}, "name"),
    ({"l2_gbps": float("nan")}, "l2_gbps"),
])
def test_replace_validates(change, field):
    with pytest.raises(pypto.PyptoError) as e:
        A2A3.replace(**change)
    assert f"'{field}'" in str(e.value)


def test_replace_unknown_field_lists_the_valid_ones():
    with pytest.raises(pypto.PyptoError) as e:
        A2A3.replace(ub_size=256)
    msg = str(e.value)
    assert "ub_size" in msg and "ub_kib" in msg and "l2_gbps" in msg


def test_zero_overheads_are_allowed():
    m = A2A3.replace(vec_head=0, dispatch_cycles=0, cube_startup=0)
    assert (m.vec_head, m.dispatch_cycles, m.cube_startup) == (0, 0, 0)


def test_ints_are_accepted_for_float_fields():
    m = A2A3.replace(clock_ghz=2, hbm_gbps=1000)
    assert isinstance(m.clock_ghz, float) and m.clock_ghz == 2.0
    assert isinstance(m.hbm_gbps, float)


# ---------------------------------------------------------------------------------------
# TOML files

def _write(tmp_path, text, name="m.toml") -> pathlib.Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_to_toml_round_trip(name, tmp_path):
    m = MACHINES[name]
    p = _write(tmp_path, m.to_toml())
    assert Machine.from_toml(p) == m
    assert load_machine(str(p)) == m


def test_full_file_without_base(tmp_path):
    p = _write(tmp_path, """
name = "tiny"
n_aic = 1
n_aiv = 2
clock_ghz = 1.0
ub_kib = 64
l1_kib = 256
l0a_kib = 32
l0b_kib = 32
l0c_kib = 64
hbm_gbps = 100
""")
    m = Machine.from_toml(p)
    assert m.name == "tiny" and (m.n_aic, m.n_aiv) == (1, 2) and m.clock_ghz == 1.0 and m.hbm_gbps == 100.0
    assert m.capacities()["UB"] == 64 * 1024
    # fields with a default keep it (path bandwidths, vector timing, L2)
    assert m.bandwidth_gibps == A2A3.bandwidth_gibps and m.vec_head == A2A3.vec_head
    assert m.l2_line_bytes == 512


def test_base_overrides_some_fields(tmp_path):
    p = _write(tmp_path, """
base = "a2a3"
ub_kib = 256
l2_mib = 96

[bandwidth_gibps]
"GM->UB" = 150.0
"L0C -> GM" = 90
""", name="bigub.toml")
    m = Machine.from_toml(p)
    assert m.name == "bigub"                                  # default name: the file's stem
    assert m.ub_kib == 256 and m.l2_mib == 96
    assert m.n_aic == 24 and m.clock_ghz == 1.85               # from the base
    assert m.bandwidth_gibps[("GM", "UB")] == 150.0 and m.bandwidth_gibps[("L0C", "GM")] == 90.0
    assert m.bandwidth_gibps[("GM", "L1")] == 135.0            # the base's other paths stay
    assert m.dma_bytes_per_cycle("GM", "UB") == pytest.approx(150 * GIB / 1.85e9)


def test_base_can_be_another_file(tmp_path):
    _write(tmp_path, 'base = "a5"\nname = "parent"\nn_aiv = 32\n', name="parent.toml")
    p = _write(tmp_path, 'base = "parent.toml"\nname = "child"\nub_kib = 128\n', name="child.toml")
    m = load_machine(p)
    assert (m.name, m.n_aic, m.n_aiv, m.ub_kib, m.clock_ghz) == ("child", 32, 32, 128, 1.65)


def test_base_cycle_is_reported(tmp_path):
    _write(tmp_path, 'base = "b.toml"\n', name="a.toml")
    _write(tmp_path, 'base = "a.toml"\n', name="b.toml")
    with pytest.raises(pypto.PyptoError, match="cycle"):
        load_machine(tmp_path / "a.toml")


def test_get_machine_accepts_machine_name_and_path(tmp_path):
    p = _write(tmp_path, 'base = "teach"\nname = "teach2"\nn_aiv = 8\n')
    assert get_machine(A5) is A5
    assert get_machine("teach") is TEACH
    assert get_machine(p).n_aiv == 8                      # pathlib.Path
    assert get_machine(str(p)).name == "teach2"           # str path
    with pytest.raises(pypto.PyptoError) as e:
        get_machine("a9")
    assert "'a2a3'" in str(e.value) and "'a5'" in str(e.value) and ".toml" in str(e.value)


def _err(tmp_path, text) -> str:
    p = _write(tmp_path, text)
    with pytest.raises(pypto.PyptoError) as e:
        Machine.from_toml(p)
    msg = str(e.value)
    assert str(p) in msg                                  # every error names the file
    return msg


def test_missing_field_without_base(tmp_path):
    msg = _err(tmp_path, 'name = "x"\nn_aic = 1\nn_aiv = 2\nclock_ghz = 1.0\nub_kib = 64\n')
    assert "missing field 'l1_kib'" in msg
    assert "l0a_kib" in msg and "hbm_gbps" in msg and "base" in msg


def test_unknown_field_lists_valid_ones(tmp_path):
    msg = _err(tmp_path, 'base = "a2a3"\nub_size_kib = 256\n')
    assert "unknown field 'ub_size_kib'" in msg
    for f in ("ub_kib", "n_aic", "bandwidth_gibps", "l2_mib", "l2_gbps", "base"):
        assert f in msg


@pytest.mark.parametrize("line, field", [
    ("ub_kib = -16", "ub_kib"), ("n_aiv = 0", "n_aiv"), ("clock_ghz = 0.0", "clock_ghz"),
    ("hbm_gbps = -1", "hbm_gbps"), ("l2_line_bytes = 0", "l2_line_bytes"), ("dispatch_cycles = -3", "dispatch_cycles"),
])
def test_negative_or_zero(tmp_path, line, field):
    msg = _err(tmp_path, f'base = "a2a3"\n{line}\n')
    assert f"'{field}'" in msg and "got" in msg


@pytest.mark.parametrize("line, field", [
    ('ub_kib = "256"', "ub_kib"), ("n_aic = 2.5", "n_aic"), ('clock_ghz = "1.8GHz"', "clock_ghz"),
    ("n_aiv = true", "n_aiv"), ("name = 3", "name"), ("l2_mib = [1, 2]", "l2_mib"),
])
def test_wrong_types(tmp_path, line, field):
    msg = _err(tmp_path, f'base = "a2a3"\n{line}\n')
    assert f"'{field}'" in msg and "must be" in msg


def test_bandwidth_table_errors(tmp_path):
    msg = _err(tmp_path, 'base = "a2a3"\n[bandwidth_gibps]\n"GM->L9" = 10.0\n')
    assert "bandwidth_gibps" in msg and "GM->L9" in msg
    msg = _err(tmp_path, 'base = "a2a3"\n[bandwidth_gibps]\n"GM->UB" = -10.0\n')
    assert "GM->UB" in msg and "positive" in msg
    msg = _err(tmp_path, 'base = "a2a3"\n[bandwidth_gibps]\n"GM->UB" = "fast"\n')
    assert "GM->UB" in msg and "number" in msg
    msg = _err(tmp_path, 'base = "a2a3"\nbandwidth_gibps = 5\n')
    assert "bandwidth_gibps" in msg and "table" in msg
    # without a base every path needs a bandwidth
    full = A2A3.replace(name="x").to_toml().replace('"UB->UB" = 1024.0\n', "")
    msg = _err(tmp_path, full)
    assert "UB->UB" in msg and "missing" in msg


def test_bad_base_bad_toml_missing_file(tmp_path):
    msg = _err(tmp_path, 'base = "a3000"\n')
    assert "a3000" in msg and "'a2a3'" in msg
    msg = _err(tmp_path, 'base = "a2a3"\nub_kib = \n')
    assert "not valid TOML" in msg
    with pytest.raises(pypto.PyptoError, match="not found"):
        Machine.from_toml(tmp_path / "nope.toml")


# ---------------------------------------------------------------------------------------
# machines in use

@pypto.jit
def _scale(x, out, *, TM: int = 32, TN: int = 512):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = x * 2.0


def test_a5_ub_fits_tiles_that_a2a3_cannot(rng):
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    # [32,1024] fp32 tiles, double-buffered in and out: more than a2a3's 192 KiB UB, within a5's 256
    with pytest.raises(pypto.TileShapeError, match="UB"):
        _scale.compile(x, np.zeros_like(x), machine="a2a3", TM=32, TN=1024)
    ck = _scale.compile(x, np.zeros_like(x), machine="a5", TM=32, TN=1024)
    res = ck.simulate(x, np.zeros_like(x))
    assert res.ok and res.machine is A5
    np.testing.assert_array_equal(res.outputs["out"], x * 2.0)
    assert res.time_us == pytest.approx(res.cycles / 1650, abs=1e-3)      # 1.65 GHz
    # and a variant with a bigger UB accepts them too
    assert _scale.compile(x, np.zeros_like(x), machine=A2A3.replace(name="ub256", ub_kib=256),
                          TM=32, TN=1024).simulate(x, np.zeros_like(x)).ok


def test_compile_for_a_toml_machine(tmp_path, rng):
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    p = tmp_path / "slow.toml"
    p.write_text('base = "a2a3"\nname = "slow"\nclock_ghz = 0.925\n')
    fast = _scale.compile(x, np.zeros_like(x), machine="a2a3").simulate(x, np.zeros_like(x))
    slow = _scale.compile(x, np.zeros_like(x), machine=str(p)).simulate(x, np.zeros_like(x))
    assert slow.machine.name == "slow" and slow.ok and fast.ok
    # the same GiB/s at half the clock: each DMA takes fewer cycles, but more microseconds
    assert slow.cycles < fast.cycles and slow.time_us > fast.time_us
