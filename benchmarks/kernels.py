"""The kernels the benchmarks measure: each with tile-shape constants, and an `_auto` twin that
sets no tile shapes (for automatic tiling)."""
import pypto


@pypto.jit
def softmax(x, out, *, TM: int = 64, TN: int = 256):
    """The tutorial softmax (DESIGN.md section 5)."""
    pypto.set_vec_tile_shapes(TM, TN)
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.jit
def softmax_auto(x, out):
    m = pypto.amax(x, dim=-1, keepdim=True)
    e = pypto.exp(x - m)
    out[:] = e / pypto.sum(e, dim=-1, keepdim=True)


@pypto.jit
def layernorm(x, w, b, out, *, TM: int = 64, TN: int = 256):
    pypto.set_vec_tile_shapes(TM, TN)
    out[:] = pypto.layernorm(x, w, b)


@pypto.jit
def layernorm_auto(x, w, b, out):
    out[:] = pypto.layernorm(x, w, b)


@pypto.jit
def matmul(a, b, c, *, ML0: int = 128, NL0: int = 128, KL0: int = 64, KL1: int = 256):
    pypto.set_cube_tile_shapes([ML0, ML0], [KL0, KL1], [NL0, NL0])
    c[:] = pypto.matmul(a, b)


@pypto.jit
def matmul_auto(a, b, c):
    c[:] = pypto.matmul(a, b)


@pypto.jit
def matmul_bias_gelu(a, b, bias, c, *, ML0: int = 128, NL0: int = 128, KL0: int = 64, KL1: int = 256,
                     VM: int = 32, VN: int = 128):
    pypto.set_cube_tile_shapes([ML0, ML0], [KL0, KL1], [NL0, NL0])
    pypto.set_vec_tile_shapes(VM, VN)
    c[:] = pypto.gelu(pypto.matmul(a, b) + bias)


@pypto.jit
def matmul_bias_gelu_auto(a, b, bias, c):
    c[:] = pypto.gelu(pypto.matmul(a, b) + bias)


# --- the kernels a user writes first (issue 11): each runs against numpy in
# tests/test_first_kernels.py, which pins its cycles, and benchmarks/first_kernels.py prints them

@pypto.jit
def causal_attention(q, k, v, out, *, TM: int = 32, TN: int = 64):
    """One head: softmax(q k^T / sqrt(d) masked to the past) v; the mask built by comparing a
    row index with a column index, applied with where."""
    s, d = q.shape
    pypto.set_vec_tile_shapes(TM, TN)
    scores = pypto.matmul(q, k, b_trans=True, out_dtype=pypto.DT_FP32) * (1.0 / d ** 0.5)
    rows = pypto.arange(s, dtype=pypto.DT_INT32).reshape(s, 1)
    cols = pypto.arange(s, dtype=pypto.DT_INT32).reshape(1, s)
    scores = pypto.where(cols <= rows, scores, float("-inf"))
    p = pypto.softmax(scores, dim=-1)
    out[:] = pypto.matmul(pypto.cast(p, pypto.DT_FP16), v)


@pypto.jit
def rope_interleaved(x, cos, sin, out, *, TM: int = 16, TN: int = 32):
    """Rotary embedding on interleaved pairs (x[..., 0::2], x[..., 1::2]), as GPT-J/LLaMA-2 ports do."""
    pypto.set_vec_tile_shapes(TM, TN)
    a, b = x[:, 0::2], x[:, 1::2]
    out[:, 0::2] = a * cos - b * sin
    out[:, 1::2] = a * sin + b * cos


@pypto.jit
def merge_heads(x, w, out):
    """[H, S, D] heads -> [S, H*D] (a transpose, then a reshape: one copy), then the output projection."""
    h, s, d = x.shape
    merged = pypto.transpose(x, 0, 1).reshape(s, h * d)
    out[:] = pypto.matmul(merged, w)


@pypto.jit
def kv_cache_decode(q, k_past, k_new, v_past, v_new, out):
    """A decode step: the new key and value appended to the cache in a scratch tensor of the
    kernel, then attention of the new query over all positions."""
    t, d = k_past.shape
    keys = pypto.zeros(t + 1, d, dtype=pypto.DT_FP16)
    keys[0:t] = k_past
    keys[t:t + 1] = k_new
    vals = pypto.concat([v_past, v_new], dim=0)
    scores = pypto.matmul(q, keys, b_trans=True, out_dtype=pypto.DT_FP32) * (1.0 / d ** 0.5)
    p = pypto.softmax(scores, dim=-1)
    out[:] = pypto.matmul(pypto.cast(p, pypto.DT_FP16), vals)


@pypto.jit
def conv_stride2(x, w, out):
    """A ResNet-style downsampling 3x3 convolution: stride 2, padding 1, NCHW."""
    out[:] = pypto.relu(pypto.conv2d(x, w, stride=2, padding=1))


@pypto.jit
def moe_router(x, w_gate, weights, counts, *, K: int = 2):
    """Top-k routing of a mixture of experts: softmax of the gate logits, the k best experts of
    each token (topk), their probabilities gathered (MGATHER) and renormalised, then per expert
    the routing weight it receives and its token count, accumulated with scatter_add (MSCATTER
    atomic=ADD) into [E] tensors."""
    tokens, experts = x.shape[0], w_gate.shape[1]
    probs = pypto.softmax(pypto.matmul(x, w_gate), dim=-1)
    _, idx = pypto.topk(probs, K)
    vals = pypto.gather(probs, 1, idx)
    vals = vals / pypto.sum(vals, -1, keepdim=True)
    flat = idx.reshape(1, tokens * K)
    weights[:] = pypto.scatter_add(pypto.zeros(1, experts), 1, flat, vals.reshape(1, tokens * K)).reshape(experts)
    counts[:] = pypto.scatter_add(pypto.zeros(1, experts, dtype=pypto.DT_INT32), 1, flat,
                                  pypto.ones(1, tokens * K, dtype=pypto.DT_INT32)).reshape(experts)
