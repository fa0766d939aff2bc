"""The default cube tile: chosen per machine by an estimate of waves x (cube vs. operand loads,
less the A chunks kept in L1 for the next tile)."""
import pytest

import pypto
from pypto.compiler.tileshape import default_cube_tile
from pypto.target.machine import get_machine

T, F16, F32 = pypto.Tensor, pypto.DT_FP16, pypto.DT_FP32


@pypto.jit
def mm(a, b, c, *, ML0: int = 0, NL0: int = 0):
    if ML0:
        pypto.set_cube_tile_shapes([ML0, ML0], [64, 256], [NL0, NL0])
    c[:] = pypto.matmul(a, b)


def test_default_cube_tile_per_machine():
    a2a3 = get_machine("a2a3")
    # without a machine: 128 x 128, K in 64-element (128-byte) steps, 4 steps per L1 chunk
    assert default_cube_tile(4096, 4096, 4096, F16) == ((128, 128), (64, 256), (128, 128))
    # 4096^3 on 24 cube cores: 128 x 256 tiles load fewer operand bytes per FLOP, and under the
    # calibrated loads (264 cycles a DMA, then 128 B/cycle) 256-deep K chunks, half the DMAs
    assert default_cube_tile(4096, 4096, 4096, F16, a2a3) == ((128, 128), (64, 256), (256, 256))
    # with the public formulas (no DMA startup, 135 GiB/s) 128-deep K chunks leave room in L1 for
    # 7 chunks of the A panel the next tile of the row reuses
    assert default_cube_tile(4096, 4096, 4096, F16, a2a3.replace(cost_model="public")) == (
        (256, 256), (64, 128), (128, 128))
    # 1024^3: 128 x 256 tiles give 32 tiles for 24 cores, no faster than 64 smaller ones
    assert default_cube_tile(1024, 1024, 1024, F16, a2a3) == ((128, 128), (64, 256), (128, 128))
    # fp32 runs the cube at half rate: compute-bound already, the smaller tile is as fast
    assert default_cube_tile(4096, 4096, 4096, F32, a2a3) == ((128, 128), (32, 128), (128, 128))
    # a 128 x 256 fp32 accumulator must fit L0C
    assert default_cube_tile(4096, 4096, 4096, F16, a2a3.replace(l0c_kib=64)) == ((128, 128), (64, 256), (128, 128))
    # small matmuls are clipped to the matrix
    assert default_cube_tile(40, 50, 60, F16, a2a3) == ((48, 48), (64, 64), (64, 64))


@pytest.mark.parametrize("m, k, n", [(1024, 1024, 1024), (2048, 256, 2048)])
def test_default_is_the_fastest_of_the_candidates(m, k, n):
    specs = (T([m, k], F16), T([k, n], F16), T([m, n], F16))
    cycles = {}
    for shape in ((128, 128), (128, 256), (256, 128)):
        ck = mm.compile(*specs, ML0=shape[0], NL0=shape[1])
        cycles[shape] = pypto.sim.simulate(ck.program, machine=ck.machine, mode="timing", trace=False).cycles
    default = mm.compile(*specs)
    got = pypto.sim.simulate(default.program, machine=default.machine, mode="timing", trace=False).cycles
    assert got == min(cycles.values()), (got, cycles)
