"""Tile shapes: normalising the user's choice to a domain, checking it, and the defaults."""
from __future__ import annotations

from ..dtypes import DType
from ..errors import SourceLoc, TileShapeError
from ..ir.tensor import TileSpec
from ..ir.core import round_up
from ..target.cost import cube_cycles

TILE_TARGET_BYTES = 16 * 1024   # default vector tile: about 16 KiB, full rows when they fit
MAX_ROW_BYTES = 8 * 1024


def default_vec_tile(domain: tuple[int, ...], dtype: DType, rows: int | None = None) -> tuple[int, ...]:
    """pypto's vector tile over `domain` for a group that starts with a value of `dtype`.

    The one home of the default vector tile.  Without `rows`: about TILE_TARGET_BYTES (16 KiB),
    with the last dim whole when a row is at most MAX_ROW_BYTES (8 KiB), else cut into 8 KiB
    pieces (32-byte aligned), and as many rows as fill the target; 1 along the leading dims.

    With `rows`: `rows` whole rows (the last dim whole, 1 along the leading dims).  Fusion asks
    for it (`fusion.whole_row_plan`) when a group reduces along the last dim and the 8 KiB pieces
    would cut that dim: the reduction then spans tiles (accumulated, complete only after a row's
    last tile), so the ops after it start another group that reads the input again, and the
    group passes over HBM several times instead of once.  `rows` is the largest power of two
    whose group's tiles fit UB with double buffering as the allocator sizes them (the live tiles
    after lifetime reuse, times two buffers), else the largest that fits single-buffered; when
    not even one whole row fits, fusion keeps the default (a 65536-wide fp32 row is 256 KiB)."""
    if rows is not None:
        if len(domain) == 1:
            return (domain[-1],)
        return (1,) * (len(domain) - 2) + (max(1, min(rows, domain[-2])), domain[-1])
    align = 32 // dtype.itemsize if dtype.itemsize <= 32 else 1
    last = min(round_up(domain[-1], align), MAX_ROW_BYTES // dtype.itemsize)
    if len(domain) == 1:
        return (last,)
    rows = max(1, min(domain[-2], TILE_TARGET_BYTES // (last * dtype.itemsize)))
    return (1,) * (len(domain) - 2) + (rows, last)


def cube_nest(cube_tile: tuple[int, int], perm: tuple[int, ...]) -> tuple[int, ...]:
    """A cube group's output tile (mL0, nL0) over the dims of a value that reads its result
    through transposes (axis k = axis perm[k] of the result): mL0 and nL0 where the result's
    last two axes went, 1 along its batch axes."""
    r = len(perm)
    return tuple(cube_tile[0] if d == r - 2 else cube_tile[1] if d == r - 1 else 1 for d in perm)


def epilogue_vec_tile(domain: tuple[int, ...], dtype: DType, nest: tuple[int, ...]) -> tuple[int, ...] | None:
    """The default tile of a vector group finishing a matmul's tiles, `nest` being the cube's
    output tile over the domain's dims (`cube_nest`): at most about 16 KiB, nested in the cube
    tile and half of it along its largest dim but the last, so that each cube tile is finished
    by whole vector tiles, half of them on each AIV of the pair.  None when the tile's rows
    would not be 32-byte aligned."""
    tile = [min(t, d) for t, d in zip(nest, domain)]
    if tile[-1] < domain[-1] and (tile[-1] * dtype.itemsize) % 32:
        return None
    split = max(range(len(tile) - 1), key=lambda k: (nest[k], k), default=None)
    if split is not None and nest[split] > 1:
        rest = 1
        for k, t in enumerate(tile):
            rest *= t if k != split else 1
        rows = 1
        while (rows * 4 <= nest[split] and nest[split] % (rows * 4) == 0
               and rows * 2 * rest * dtype.itemsize <= TILE_TARGET_BYTES):
            rows *= 2
        tile[split] = min(rows, domain[split])
    return tuple(tile)


def matmul_cube_tile(g, n, machine) -> tuple[int, int, int, int]:
    """(mL0, kL0, nL0, kL1) of matmul node n of tensor graph g: the kernel's, or the default."""
    a = g.node(n.inputs[0])
    k = matmul_k(g, n)
    m_, n_ = n.shape[-2:]
    batch = 1
    for d in n.shape[:-2]:
        batch *= d
    return normalize_cube_tile(n.attrs.get("tile"), m_, k, n_, a.dtype, n.loc, machine, batch)


def matmul_k(g, n) -> int:
    """The reduced dim K of matmul node n of tensor graph g."""
    a = g.node(n.inputs[0])
    return a.shape[-2] if n.attrs["a_trans"] else a.shape[-1]


def normalize_vec_tile(spec, domain, dtype: DType, loc: SourceLoc | None, rows: int | None = None) -> tuple[int, ...]:
    """Tile over `domain` from a user spec (or the default, `rows` whole rows when given: see
    `default_vec_tile`), clipped to the domain."""
    r = len(domain)
    if isinstance(spec, TileSpec):          # the error points at the set_vec_tile_shapes line
        spec, loc = spec.dims, spec.loc or loc
    if not spec:
        spec = default_vec_tile(domain, dtype, rows)
    spec = tuple(spec[-r:]) if len(spec) >= r else (1,) * (r - len(spec)) + tuple(spec)
    last, n = spec[-1], domain[-1]
    if last < n and (last * dtype.itemsize) % 32:
        raise TileShapeError(
            f"vector tile {list(spec)} is not 32-byte aligned for {dtype}", loc=loc,
            expected=f"the last tile dim x {dtype.itemsize} bytes to be a multiple of 32 "
                     f"(a multiple of {32 // dtype.itemsize} elements)",
            got=f"{last} elements = {last * dtype.itemsize} bytes",
            hint=f"round the last dim to a multiple of {32 // dtype.itemsize}: "
                 + " or ".join(str(c) for c in dict.fromkeys(
                     c for c in ((last // (32 // dtype.itemsize)) * (32 // dtype.itemsize),
                                 round_up(last, 32 // dtype.itemsize)) if c > 0)))
    return tuple(min(t, d) for t, d in zip(spec, domain))


def k0_of(dtype: DType) -> int:
    """Cube fractal depth: 32 bytes of the A operand's dtype."""
    return 32 // dtype.itemsize


def default_cube_tile(m: int, k: int, n: int, dtype: DType, machine=None, batch: int = 1):
    """128 x 128 output tiles streaming K in kL1 = 4 kL0, or, given the machine, the output tile
    (128x128, 128x256 or 256x128) and kL1 (2 or 4 kL0) with the least estimated time (below).
    kL0 = 128 bytes of A per row."""
    k0 = k0_of(dtype)
    kl0 = min(round_up(k, k0), 128 // dtype.itemsize)      # 64 fp16, 32 fp32, 128 int8
    if machine is None:
        return ((128, 128), (kl0, min(round_up(k, kl0), kl0 * 4)), (128, 128))
    cands = [(mn, min(round_up(k, kl0), kl0 * f))
             for mn in ((128, 128), (128, 256), (256, 128)) for f in (4, 2)
             if mn == (128, 128) or _acc_bytes(mn) <= machine.l0c_kib * 1024]
    (ml0, nl0), kl1 = min(cands, key=lambda c: (_estimate(c[0], m, k, n, c[1], dtype, machine, batch),
                                                -c[1], c[0]))
    ml0, nl0 = min(round_up(m, 16), ml0), min(round_up(n, 16), nl0)
    return ((ml0, ml0), (kl0, kl1), (nl0, nl0))


def _acc_bytes(mn) -> int:
    return mn[0] * mn[1] * 4        # L0C accumulates in fp32 / int32


def shared_panel(nm: int, nn: int, batch: int = 1, broadcast: str | None = None) -> str | None:
    """The operand ("a" or "b") whose panel consecutive output tiles of a task share, walked
    row by row over nm x nn tiles: A along a row of tiles, B down a single column; with one tile
    per batch index, the operand broadcast over the batch (`broadcast`: a convolution's
    weights).  None: no panel is shared."""
    if nn > 1:
        return "a"
    if nm > 1:
        return "b"
    return broadcast if batch > 1 else None


def _estimate(mn, m, k, n, kl1, dtype: DType, machine, batch) -> float:
    """Cycles of a matmul with output tiles mn: waves of tiles over the cube cores, each tile
    taking the longer of its cube time and the GM->L1 load of its operands (MTE2 overlaps the
    cube with double buffering), plus the L0C drain when L0C has no room for a second
    accumulator (the next tile waits for the store).

    The operand panel consecutive tiles share (`shared_panel`) is not loaded again for
    the K chunks still in L1 (see the `l1_reuse` pass): as many chunks as fit next to two
    chunks of the other operand."""
    ml0, nl0 = mn
    nm, nn = -(-m // ml0), -(-n // nl0)
    waves = -(-(batch * nm * nn) // machine.n_aic)
    nk1 = -(-k // kl1)
    a_chunk, b_chunk = ml0 * kl1 * dtype.itemsize, kl1 * nl0 * dtype.itemsize
    panel = shared_panel(nm, nn)
    shared, other = {"a": (a_chunk, b_chunk), "b": (b_chunk, a_chunk)}.get(panel, (0, a_chunk + b_chunk))
    kept = 0
    if shared:
        kept = min(nk1, max(2, (machine.l1_kib * 1024 - 2 * other) // shared)) * shared
    loaded = nk1 * (a_chunk + b_chunk) - kept
    dmas = 2 * nk1 - (kept // shared if shared else 0)      # each chunk loaded is a DMA
    fixed = dmas * machine.dma_burst_cycles if machine.cost_model == "calibrated" else 0
    tile = max(nk1 * cube_cycles(ml0, kl1, nl0, dtype.itemsize, machine),
               loaded / machine.gm_load_bytes_per_cycle("GM", "L1") + fixed)
    drain = 0.0
    if 2 * _acc_bytes(mn) > machine.l0c_kib * 1024:
        drain = ml0 * nl0 * dtype.itemsize / machine.dma_bytes_per_cycle("L0C", "GM")
    return waves * (tile + drain)


def normalize_cube_tile(spec, m: int, k: int, n: int, dtype: DType, loc, machine=None, batch: int = 1):
    """((mL0, mL1), (kL0, kL1), (nL0, nL1)) checked against the cube's alignment, clipped to the
    matmul; without a spec, the default for the machine."""
    if isinstance(spec, TileSpec):
        spec, loc = spec.dims, spec.loc or loc
    if not spec:
        spec = default_cube_tile(m, k, n, dtype, machine, batch)
    (ml0, ml1), (kl0, kl1), (nl0, nl1) = spec
    k0 = k0_of(dtype)
    for name, v, a in (("mL0", ml0, 16), ("nL0", nl0, 16), ("kL0", kl0, k0)):
        if v % a:
            raise TileShapeError(f"cube tile {name}={v} is not aligned to the {a}-element fractal",
                                 loc=loc, expected=f"a multiple of {a} for {dtype}", got=v,
                                 hint=f"{name}={round_up(v, a)}" + (f" or {v // a * a}" if v > a else ""))
    ml0 = min(ml0, round_up(m, 16))
    nl0 = min(nl0, round_up(n, 16))
    kl0 = min(kl0, round_up(k, k0))
    kl1 = max(kl0, min(round_up(kl1, kl0), round_up(k, kl0)))
    return (ml0, kl0, nl0, kl1)
