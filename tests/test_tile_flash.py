"""A flash-attention forward written by hand (issue #15), at the Block level: single head,
S x D = 256 x 64, fp16 Q / K / V, fp32 softmax state, blocks of 64 queries and 64 keys.

Per query block i and key block j: a cube task computes S_ij = Q_i K_j^T (L1 staging, L0A / L0B,
L0C) into a GM workspace; a vector task runs the online softmax step (running row max m and sum
l in GM, the rescale factor alpha = exp(m_old - m_new), P_ij = exp(S_ij * scale - m_new) stored
in fp16); a cube task computes P_ij V_j; a vector task per query block accumulates the products,
rescaled by each step's alpha, and divides by l.  The online state passes from key block j to
j + 1 through GM between tasks of one loop: the Block level orders such tasks by their GM
windows, the Tile level does not order the iterations of one group (its chains are grouped and
split over cores by the compiler), so the kernel is written at the Block level."""
from __future__ import annotations

import math

import numpy as np
import pytest

import pypto

T, B = pypto.tile, pypto.block


@pypto.jit(level="block")
def flash_attn(q, kt, v, s_ws, p_ws, m, l, alpha, pv_ws, out, *, BQ: int = 64, BK: int = 64):
    """out = softmax(q k^T / sqrt(D)) v, with k given transposed (kt: D x S, as the cube's
    right operand wants it).  Workspaces (GM, passed by the caller): s_ws [S, S] fp32 scores,
    p_ws [S, S] fp16 probabilities, m / l [S, 1] fp32 running max / sum, alpha [S, S / BK] fp32
    rescale factors, pv_ws [S, S / BK * D] fp32 products P_ij V_j."""
    S, D = q.shape
    scale = 1.0 / math.sqrt(D)
    for i in range(0, S, BQ):
        rows = slice(i, i + BQ)
        for jb, j in enumerate(range(0, S, BK)):
            cols = slice(j, j + BK)
            with B.task("AIC"):                                   # S_ij = Q_i K_j^T
                q0 = T.textract(T.tload(q[rows, :], space="L1"), "L0A")
                k0 = T.textract(T.tload(kt[:, cols], space="L1"), "L0B")
                T.tstore(s_ws[rows, cols], T.tmatmul(q0, k0))
            with B.task("AIV"):                                   # the online softmax step
                s = T.tmuls(T.tload(s_ws[rows, cols]), scale)
                row_max = T.trowmax(s)
                if jb == 0:
                    m_new = row_max
                else:
                    m_old = T.tload(m[rows, :])
                    m_new = T.tmax(m_old, row_max)
                    a = T.texp(T.tsub(m_old, m_new))              # exp(m_old - m_new)
                    T.tstore(alpha[rows, jb:jb + 1], a)
                p = T.texp(T.trowexpandsub(s, m_new))
                l_new = T.trowsum(p) if jb == 0 else T.tadd(T.tmul(T.tload(l[rows, :]), a), T.trowsum(p))
                T.tstore(m[rows, :], m_new)
                T.tstore(l[rows, :], l_new)
                T.tstore(p_ws[rows, cols], T.tcvt(p, pypto.DT_FP16))
            with B.task("AIC"):                                   # P_ij V_j
                p0 = T.textract(T.tload(p_ws[rows, cols], space="L1"), "L0A")
                v0 = T.textract(T.tload(v[cols, :], space="L1"), "L0B")
                T.tstore(pv_ws[rows, jb * D:(jb + 1) * D], T.tmatmul(p0, v0))
        with B.task("AIV"):                                       # O = sum_j (prod alpha) P_ij V_j, / l
            o = T.tload(pv_ws[rows, 0:D])
            for jb in range(1, S // BK):
                o = T.tadd(T.trowexpandmul(o, T.tload(alpha[rows, jb:jb + 1])), T.tload(pv_ws[rows, jb * D:(jb + 1) * D]))
            T.tstore(out[rows, :], T.tcvt(T.trowexpanddiv(o, T.tload(l[rows, :])), pypto.DT_FP16))


@pypto.jit
def attn_tensor(q, k, v, out):
    """The same attention at the Tensor level: fp16 matmuls, an fp32 softmax."""
    s = pypto.matmul(q, k, out_dtype=pypto.DT_FP32, b_trans=True) * (1.0 / math.sqrt(q.shape[1]))
    out[:] = pypto.matmul(pypto.cast(pypto.softmax(s, dim=-1), pypto.DT_FP16), v)


def flash_args(q, k, v, BK: int = 64):
    S, D = q.shape
    nk = S // BK
    return (q, np.ascontiguousarray(k.T), v, np.zeros((S, S), np.float32), np.zeros((S, S), np.float16),
            np.zeros((S, 1), np.float32), np.zeros((S, 1), np.float32), np.zeros((S, nk), np.float32),
            np.zeros((S, nk * D), np.float32), np.zeros((S, D), np.float16))


def attention_ref(q, k, v):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ k.T / math.sqrt(q.shape[1])
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def qkv(rng, S=256, D=64):
    return tuple(rng.standard_normal((S, D)).astype(np.float16) for _ in range(3))


@pytest.mark.parametrize("machine", ["a2a3", "teach"])
def test_flash_attention_matches_numpy(machine, rng):
    q, k, v = qkv(rng)
    args = flash_args(q, k, v)
    ck = flash_attn.compile(*args, machine=machine)
    res = ck.simulate(*args)
    assert res.ok, res.check
    got = res.outputs["out"].astype(np.float64)
    np.testing.assert_allclose(got, attention_ref(q, k, v), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(res.outputs["m"][:, 0], (q.astype(np.float64) @ k.T.astype(np.float64)).max(1) / 8,
                               rtol=1e-2, atol=1e-2)


def test_flash_attention_tasks_and_cycles(rng):
    q, k, v = qkv(rng)
    args = flash_args(q, k, v)
    ck = flash_attn.compile(*args)
    tasks = ck.block_graph.tasks
    assert sum(t.core_type == "AIC" for t in tasks) == 2 * 16 and sum(t.core_type == "AIV" for t in tasks) == 16 + 4
    timed = ck.simulate(*args, mode="timing")
    for t in ck.program.tasks:                       # every dependency ended before its task started
        for d in t.deps:
            assert timed.task_times[d][2] <= timed.task_times[t.id][1]
    out = np.zeros_like(q)
    tensor = attn_tensor.compile(q, k, v, out).simulate(q, k, v, out, mode="timing")
    print(f"flash attention (block level): {timed.cycles} cycles; Tensor-level attention: {tensor.cycles} cycles")
    assert timed.cycles > 0 and tensor.cycles > 0
