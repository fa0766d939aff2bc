"""pypto.nn: torch.nn's modules written with pypto ops, checked against torch 2.13 with the same
state dict.

Tolerances: fp32 throughout.  A Linear / attention output is a sum of K products computed in
another order (the cube accumulates tile by tile), so it differs from torch's by a few ulps of
the sum of magnitudes: rtol 1e-4 with atol 1e-5 (values of order 1) covers K up to a few hundred
with a wide margin; a LayerNorm after it divides by a standard deviation of order 1 (no
amplification).  Shapes are small: the whole file runs in well under a minute."""
from __future__ import annotations

import collections
import math

import numpy as np
import pytest

import pypto
import pypto.nn as nn
from pypto.frontend.jit import JitKernel

torch = pytest.importorskip("torch")

RTOL, ATOL = 1e-4, 1e-5


def _sd(tm):
    return {k: v.detach().numpy() for k, v in tm.state_dict().items()}


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def _close(got, want, rtol=RTOL, atol=ATOL):
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.fixture
def x3(rng):
    return rng.standard_normal((2, 5, 16)).astype(np.float32)


@pytest.fixture
def traces(monkeypatch):
    """The number of kernel traces (one per compile) since the fixture was made."""
    count = collections.Counter()
    real = JitKernel._trace

    def counting(self, *a, **k):
        count[self.name] += 1
        return real(self, *a, **k)
    monkeypatch.setattr(JitKernel, "_trace", counting)
    return count


# --- modules against torch ------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(rng, bias):
    tm = torch.nn.Linear(16, 8, bias=bias)
    m = nn.Linear(16, 8, bias=bias)
    assert list(m.state_dict()) == list(tm.state_dict())
    m.load_state_dict(tm.state_dict())                      # torch tensors load too
    for shape in [(16,), (3, 16), (2, 5, 16)]:
        x = rng.standard_normal(shape).astype(np.float32)
        _close(m(x), tm(_t(x)))
    _close(m(_t(x)), tm(_t(x)))                              # a torch tensor in, numpy out
    _close(m(x.astype(np.float64)), tm(_t(x)))               # float64 is taken as float32


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("kw", [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3), padding="same", bias=False),   # odd total padding: torch pads after
    dict(kernel_size=3, groups=2, dilation=(1, 2)),
])
def test_conv2d_matches_torch(rng, kw):
    tm = torch.nn.Conv2d(4, 6, **kw)
    m = nn.Conv2d(4, 6, **kw)
    assert list(m.state_dict()) == list(tm.state_dict()) and m.weight.shape == tuple(tm.weight.shape)
    m.load_state_dict(_sd(tm))
    x = rng.standard_normal((2, 4, 9, 10)).astype(np.float32)
    _close(m(x), tm(_t(x)))
    _close(m(x[0]), tm(_t(x[0])))                          # unbatched
    assert nn.Conv2D is nn.Conv2d


def test_norms_embedding_activations_match_torch(rng, x3):
    ln, tln = nn.LayerNorm(16), torch.nn.LayerNorm(16)
    tln.weight.data.uniform_(0.5, 1.5)
    tln.bias.data.uniform_(-1, 1)
    ln.load_state_dict(_sd(tln))
    _close(ln(x3), tln(_t(x3)))
    ln2, tln2 = nn.LayerNorm((5, 16), eps=1e-3), torch.nn.LayerNorm((5, 16), eps=1e-3)
    tln2.weight.data.uniform_(0.5, 1.5)
    ln2.load_state_dict(_sd(tln2))
    _close(ln2(x3), tln2(_t(x3)))
    for eps in (None, 1e-5):
        rn, trn = nn.RMSNorm(16, eps=eps), torch.nn.RMSNorm(16, eps=eps)
        trn.weight.data.uniform_(0.5, 1.5)
        rn.load_state_dict(_sd(trn))
        _close(rn(x3), trn(_t(x3)))
    _close(nn.RMSNorm(16, elementwise_affine=False)(x3), torch.nn.RMSNorm(16, elementwise_affine=False)(_t(x3)))
    em, tem = nn.Embedding(10, 4, padding_idx=0), torch.nn.Embedding(10, 4, padding_idx=0)
    em.load_state_dict(_sd(tem))
    idx = rng.integers(0, 10, (3, 7))                       # int64, as torch's indices are
    _close(em(idx), tem(torch.from_numpy(idx)), 0, 0)
    assert np.all(nn.Embedding(10, 4, padding_idx=2).weight.data[2] == 0)
    for mine, theirs in [(nn.ReLU(), torch.nn.ReLU()), (nn.GELU(), torch.nn.GELU()),
                         (nn.GELU("tanh"), torch.nn.GELU("tanh")), (nn.SiLU(), torch.nn.SiLU()),
                         (nn.Tanh(), torch.nn.Tanh()), (nn.Sigmoid(), torch.nn.Sigmoid()),
                         (nn.Softmax(dim=-1), torch.nn.Softmax(dim=-1)), (nn.Identity(), torch.nn.Identity())]:
        _close(mine(3 * x3), theirs(_t(3 * x3)), 1e-5, 1e-6)


def test_dropout_is_the_identity_in_both_modes(x3):
    d = nn.Dropout(0.3)
    assert d.training
    np.testing.assert_array_equal(d(x3), x3)
    np.testing.assert_array_equal(d.eval()(x3), x3)


def test_erf_and_exact_gelu_are_fp32_accurate():
    """The registry's erf: within 3 fp32 ulps of torch over the whole range (small, around the
    branch at 1, the tail), and its honest check passes; gelu(approximate="none") too."""
    x = np.concatenate([np.linspace(-6, 6, 3001), [0.0, 1e-30, -1e-7, 0.9999999, 1.0, 1.0000001, 9.0, -30.0]])
    x = np.resize(x.astype(np.float32), (16, 192))

    @pypto.jit
    def k(x, e, g):
        e[:] = pypto.erf(x)
        g[:] = pypto.gelu(x, approximate="none")
    e, g = np.zeros_like(x), np.zeros_like(x)
    res = k.compile(x, e, g).simulate(x, e, g)
    assert res.ok, res.check
    want = torch.erf(_t(x)).numpy()
    ulps = np.abs(res.outputs["e"] - want) / np.spacing(np.maximum(np.abs(want), np.float32(1e-38)))
    assert ulps.max() <= 3
    _close(res.outputs["g"], torch.nn.functional.gelu(_t(x)), 1e-6, 1e-6)
    with pytest.raises(pypto.UnsupportedError, match="approximate"):
        k2 = pypto.jit(lambda x, out: out.__setitem__(slice(None), pypto.gelu(x, approximate="erf")))
        k2(x, np.zeros_like(x))


# --- attention -------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_matches_torch(rng, batch_first):
    tm = torch.nn.MultiheadAttention(16, 4, batch_first=batch_first)
    m = nn.MultiheadAttention(16, 4, batch_first=batch_first)
    assert list(m.state_dict()) == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    assert list(m.state_dict()) == list(tm.state_dict())
    m.load_state_dict(_sd(tm))
    n, length, s = 2, 5, 7
    q = rng.standard_normal((n, length, 16) if batch_first else (length, n, 16)).astype(np.float32)
    kv = rng.standard_normal((n, s, 16) if batch_first else (s, n, 16)).astype(np.float32)
    v = rng.standard_normal(kv.shape).astype(np.float32)
    out, w = m(q, q, q)                                      # self-attention: one fused projection
    tout, tw = tm(_t(q), _t(q), _t(q))
    _close(out, tout)
    _close(w, tw)
    out, w = m(q, kv, v, need_weights=False)                 # cross-attention, no weights
    assert w is None
    _close(out, tm(_t(q), _t(kv), _t(v), need_weights=False)[0])
    # masks: bool (True: not attended), float (added), per head, key padding; weights per head
    bool_mask = rng.random((length, s)) < 0.3
    bool_mask[:, 0] = False
    float_mask = rng.standard_normal((n * 4, length, s)).astype(np.float32)
    kpm = np.zeros((n, s), bool)
    kpm[1, -2:] = True
    for kw in [dict(attn_mask=bool_mask), dict(attn_mask=float_mask), dict(key_padding_mask=kpm),
               dict(attn_mask=bool_mask, key_padding_mask=kpm, average_attn_weights=False)]:
        got = m(q, kv, v, **kw)
        want = tm(_t(q), _t(kv), _t(v), **{k: _t(a) if isinstance(a, np.ndarray) else a for k, a in kw.items()})
        _close(got[0], want[0])
        _close(got[1], want[1])


def test_multihead_attention_causal_and_unbatched(rng):
    tm = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    m = nn.MultiheadAttention(8, 2, batch_first=True)
    m.load_state_dict(_sd(tm))
    x = rng.standard_normal((1, 6, 8)).astype(np.float32)
    causal = np.triu(np.ones((6, 6), bool), 1)
    want = tm(_t(x), _t(x), _t(x), attn_mask=_t(causal), is_causal=True, need_weights=False)[0]
    _close(m(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0], want)
    _close(m(x, x, x, is_causal=True, need_weights=False)[0], want)      # the mask built in the kernel
    out, w = m(x[0], x[0], x[0])                                          # [L, E]
    tout, tw = tm(_t(x[0]), _t(x[0]), _t(x[0]))
    _close(out, tout)
    _close(w, tw)


@pytest.mark.parametrize("kw", [dict(), dict(norm_first=True, activation="gelu"), dict(batch_first=False)])
def test_transformer_encoder_layer_matches_torch(rng, kw):
    kw = {"batch_first": True, **kw}
    tm = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, **kw).eval()
    m = nn.TransformerEncoderLayer(16, 4, 32, **kw)
    assert list(m.state_dict()) == list(tm.state_dict())
    m.load_state_dict(_sd(tm))
    x = rng.standard_normal((2, 6, 16) if kw["batch_first"] else (6, 2, 16)).astype(np.float32)
    _close(m(x), tm(_t(x)))
    kpm = np.zeros((2, 6), bool)
    kpm[0, -1] = True
    _close(m(x, src_key_padding_mask=kpm), tm(_t(x), src_key_padding_mask=_t(kpm)))


def test_transformer_keys_outputs_and_one_compile_for_all_layers(rng, traces):
    m = nn.Transformer(d_model=16, nhead=4, num_layers=3, dim_feedforward=32)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    tm = torch.nn.TransformerEncoder(layer, 3, enable_nested_tensor=False).eval()
    assert list(m.state_dict()) == list(tm.state_dict())
    assert "layers.0.self_attn.in_proj_weight" in m.state_dict() and "layers.2.norm2.bias" in m.state_dict()
    for k, v in m.state_dict().items():
        assert v.shape == tuple(tm.state_dict()[k].shape), k
    # each layer initialised on its own; then torch's values loaded (layers differ after a step)
    assert not np.array_equal(m.layers[0].linear1.weight.data, m.layers[1].linear1.weight.data)
    sd = _sd(tm)
    for k in sd:
        if k.startswith("layers.1."):
            sd[k] = sd[k] * 0.5 + 0.01
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
    m.load_state_dict(sd)
    x = rng.standard_normal((2, 6, 16)).astype(np.float32)
    traces.clear()
    _close(m(x), tm(_t(x)))
    assert traces == {"TransformerEncoderLayer": 1}           # one compile serves the three layers
    _close(m(x), tm(_t(x)))
    assert traces == {"TransformerEncoderLayer": 1}           # and a second call none
    # torch's TransformerEncoder built the torch way (copies of one layer) loads the same way
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 3)
    assert list(enc.state_dict()) == list(tm.state_dict())
    enc.load_state_dict(sd)
    _close(enc(x), tm(_t(x)))
    assert traces == {"TransformerEncoderLayer": 1}           # the same structure: the same kernel


def test_sequential_and_module_list():
    tm = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    assert list(m.state_dict()) == list(tm.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    m.load_state_dict(_sd(tm))
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(3, 8)
    _close(m(x), tm(_t(x)))
    jk, arrays, names = m.to_kernel(x)
    assert jk.tensor_params == ["input", "p_0_weight", "p_0_bias", "p_2_weight", "p_2_bias", "out"]
    assert names == {"p_0_weight": "0.weight", "p_0_bias": "0.bias", "p_2_weight": "2.weight", "p_2_bias": "2.bias"}
    assert len(m) == 3 and isinstance(m[1], nn.GELU) and list(m[1:].state_dict()) == ["2.weight", "2.bias"]
    ml = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 3)])
    assert len(ml) == 2 and ml[-1].out_features == 3
    assert [k for k, _ in ml.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    with pytest.raises(pypto.PyptoError, match="ModuleList has no forward"):
        ml(x)


# --- the module API -------------------------------------------------------------------------------

def test_parameters_are_numpy_arrays_with_grads_and_modes():
    m = nn.TransformerEncoderLayer(8, 2, 16)
    p = m.linear1.weight
    assert isinstance(p, nn.Parameter) and isinstance(p.data, np.ndarray) and p.data.dtype == np.float32
    assert np.asarray(p) is p.data and m.state_dict()["linear1.weight"] is p.data
    assert p.grad is None and all(q.grad is None for q in m.parameters())
    names = [k for k, _ in m.named_parameters()]
    assert names == list(m.state_dict()) and len(list(m.parameters())) == 12
    for q in m.parameters():
        q.grad = np.ones_like(q.data)
    m.zero_grad()
    assert all(q.grad is None for q in m.parameters())
    m.linear1.weight.grad = np.ones_like(p.data)
    m.zero_grad(set_to_none=False)
    assert np.all(m.linear1.weight.grad == 0)
    assert m.training and m.self_attn.out_proj.training
    m.eval()
    assert not any(x.training for x in m.modules())
    m.train()
    assert all(x.training for x in m.modules())
    assert "TransformerEncoderLayer(" in repr(m) and "(linear1): Linear(in_features=8, out_features=16" in repr(m)
    with pytest.raises(pypto.PyptoError, match="is a parameter"):
        m.linear1.weight = np.zeros((16, 8))


def test_seeded_initialisation_follows_torch_distributions():
    a, b = nn.Linear(64, 32, seed=3), nn.Linear(64, 32, seed=3)
    assert np.array_equal(a.weight.data, b.weight.data)
    nn.manual_seed(7)
    c = nn.Linear(64, 32)
    nn.manual_seed(7)
    d = nn.Linear(64, 32)
    assert np.array_equal(c.weight.data, d.weight.data) and not np.array_equal(a.weight.data, c.weight.data)
    bound = 1 / math.sqrt(64)                                   # kaiming_uniform(a=sqrt(5)): U(+-1/sqrt(fan_in))
    for p in (a.weight.data, a.bias.data):
        assert np.abs(p).max() <= bound and np.abs(p).max() > 0.9 * bound
    assert abs(a.weight.data.std() - bound / math.sqrt(3)) < 0.1 * bound
    mha = nn.MultiheadAttention(32, 4, seed=1)
    xavier = math.sqrt(6 / (32 + 3 * 32))
    assert np.abs(mha.in_proj_weight.data).max() <= xavier and not mha.in_proj_bias.data.any()
    assert not mha.out_proj.bias.data.any()
    e = nn.Embedding(1000, 16, seed=0).weight.data
    assert abs(e.mean()) < 0.05 and abs(e.std() - 1) < 0.05
    ln = nn.LayerNorm(8)
    assert np.all(ln.weight.data == 1) and np.all(ln.bias.data == 0)
    conv = nn.Conv2d(3, 4, 3, seed=0)
    assert np.abs(conv.weight.data).max() <= 1 / math.sqrt(27)


def test_load_state_dict_errors_name_the_key():
    m = nn.TransformerEncoderLayer(8, 2, 16)
    sd = {k: v.copy() for k, v in m.state_dict().items()}
    before = m.linear1.weight.data.copy()
    bad = dict(sd, **{"linear1.weight": np.zeros((16, 9), np.float32)})
    with pytest.raises(nn.StateDictError) as e:
        m.load_state_dict(bad)
    assert "'linear1.weight' has the wrong shape" in str(e.value)
    assert e.value.expected == "linear1.weight: [16, 8]" and e.value.got == "linear1.weight: [16, 9]"
    assert "test_nn.py" in str(e.value)                         # the user's line
    assert np.array_equal(m.linear1.weight.data, before)        # nothing copied
    missing = {k: v for k, v in sd.items() if k != "norm2.bias"}
    with pytest.raises(nn.StateDictError, match="missing key 'norm2.bias'") as e:
        m.load_state_dict(missing)
    assert isinstance(e.value, pypto.PyptoError) and e.value.expected == "'norm2.bias': [8]"
    with pytest.raises(nn.StateDictError, match="unexpected key 'norm3.weight'"):
        m.load_state_dict(dict(sd, **{"norm3.weight": np.ones(8, np.float32)}))
    sd["linear1.weight"] = np.full((16, 8), 0.25)               # float64: cast to the parameter's dtype
    res = m.load_state_dict(dict(missing, **{"extra": np.ones(1)}, **{"linear1.weight": sd["linear1.weight"]}),
                            strict=False)
    assert res.missing_keys == ["norm2.bias"] and res.unexpected_keys == ["extra"]
    assert m.linear1.weight.data.dtype == np.float32 and np.all(m.linear1.weight.data == 0.25)


def test_wrong_input_shape_names_the_module_and_the_line(rng):
    m = nn.Linear(16, 8)
    with pytest.raises(pypto.ShapeError) as e:
        m(rng.standard_normal((3, 12)).astype(np.float32))      # <- the line the error names
    msg = str(e.value)
    assert "Linear: the input's last dim is not in_features" in msg
    assert e.value.expected == "[..., 16]" and e.value.got == [3, 12]
    assert e.value.loc is not None and e.value.loc.file.endswith("test_nn.py")
    assert "m(rng.standard_normal((3, 12))" in msg
    t = nn.Transformer(16, 4, 2, dim_feedforward=32)
    with pytest.raises(pypto.ShapeError) as e:
        t(rng.standard_normal((1, 4, 12)).astype(np.float32))
    assert "Transformer.layers.0 (TransformerEncoderLayer)" in str(e.value) and e.value.got == [1, 4, 12]
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = rng.standard_normal((1, 4, 8)).astype(np.float32)
    with pytest.raises(pypto.ShapeError, match="attn_mask is not"):
        mha(x, x, x, attn_mask=np.zeros((3, 3), bool))
    with pytest.raises(pypto.DTypeError, match="Linear: the input's dtype"):
        m(np.zeros((2, 16), np.float16))


# --- composition in kernels, to_kernel and the cache ----------------------------------------------

class Block(nn.Module):
    """A user's module: a residual MLP written with pypto ops and sub-modules."""

    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)
        self.scale = nn.Parameter(np.full(d, 0.5, np.float32))

    def forward(self, x):
        return x + self.down(pypto.relu(self.up(self.norm(x)))) * self.scale


def _block_numpy(b, x):
    sd = b.state_dict()
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    h = (x - mu) / np.sqrt(var + 1e-5) * sd["norm.weight"] + sd["norm.bias"]
    h = np.maximum(h @ sd["up.weight"].T + sd["up.bias"], 0)
    return x + (h @ sd["down.weight"].T + sd["down.bias"]) * sd["scale"]


def test_user_module_and_composition_inside_a_jit_kernel(rng, traces):
    b = Block(16)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    _close(b(x), _block_numpy(b, x))
    assert [k for k, _ in b.named_parameters()][:3] == ["scale", "norm.weight", "norm.bias"]

    @pypto.jit
    def k(x, norm_w, norm_b, up_w, up_b, down_w, down_b, scale, out):
        params = {"norm.weight": norm_w, "norm.bias": norm_b, "up.weight": up_w, "up.bias": up_b,
                  "down.weight": down_w, "down.bias": down_b, "scale": scale}
        h = nn.functional_call(b, params, x)
        out[:] = nn.functional_call(b, params, h) * 2.0          # the block twice, then more ops
    sd = b.state_dict()
    out = np.zeros_like(x)
    k(x, *[sd[n] for n in ("norm.weight", "norm.bias", "up.weight", "up.bias", "down.weight", "down.bias",
                           "scale")], out)
    _close(out, 2 * _block_numpy(b, _block_numpy(b, x)))

    @pypto.jit
    def unbound(x, out):
        out[:] = b(x)                                               # no tensors for its parameters
    with pytest.raises(nn.UnboundParameterError, match=r"parameter 'weight' of Block.norm \(LayerNorm\)") as e:
        unbound(x, np.zeros_like(x))
    assert "functional_call" in e.value.hint


def test_to_kernel_and_a_loss_traced_with_fn(rng, traces):
    m = nn.Linear(8, 4, seed=0)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    y = rng.standard_normal((5, 4)).astype(np.float32)
    jk, arrays, names = m.to_kernel(x)
    assert isinstance(jk, pypto.JitKernel) and jk.tensor_params == ["input", "weight", "bias", "out"]
    assert arrays[1] is m.weight.data and arrays[3].shape == (5, 4) and not arrays[3].any()
    assert names == {"weight": "weight", "bias": "bias"}
    jk(*arrays)
    _close(arrays[3], x @ m.weight.data.T + m.bias.data)

    def mse(module, x, target):
        d = module(x) - target
        return pypto.mean(d * d, dim=None)                        # a 0-d result: output shape [1]
    jk, arrays, names = m.to_kernel(x, y, fn=mse)
    assert jk.tensor_params == ["x", "target", "weight", "bias", "out"] and arrays[-1].shape == (1,)
    res = jk.compile(*arrays).simulate(*arrays)
    assert res.ok
    want = np.mean((x @ m.weight.data.T + m.bias.data - y) ** 2)
    np.testing.assert_allclose(res.outputs["out"], [want], rtol=1e-5)
    # the cache: per module, input shapes and machine; new shapes compile once more
    traces.clear()
    m(x)
    m(x)
    assert traces["Linear"] == 0                                   # compiled by to_kernel(x) already
    m(x[:3])
    m(x[:3])
    assert traces["Linear"] == 1
    m.to("teach")(x)
    assert traces["Linear"] == 2 and m.machine == "teach"


@pytest.mark.skipif(not hasattr(pypto, "grad"), reason="pypto.grad is not there")
def test_a_loss_kernel_differentiates_to_torch_gradients(rng):
    """What the gradient engineer builds on: to_kernel(fn=loss) is an ordinary kernel, and
    pypto.grad of it wrt the parameters' arguments gives torch's gradients."""
    m = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, activation="gelu", seed=0)
    x = rng.standard_normal((2, 6, 16)).astype(np.float32)
    r = rng.standard_normal((2, 6, 16)).astype(np.float32)

    def loss(module, x, r):
        return pypto.sum(module(x) * r, dim=None)             # a random projection: well conditioned
    jk, arrays, names = m.to_kernel(x, r, fn=loss)
    grads = pypto.grad(jk, wrt=list(names))(*arrays)
    tm = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, activation="gelu")
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in m.state_dict().items()})
    (tm(_t(x)) * _t(r)).sum().backward()
    tp = dict(tm.named_parameters())
    for arg, key in names.items():
        want = tp[key].grad.numpy()
        np.testing.assert_allclose(grads[arg], want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=key)


def test_an_encoder_layer_kernel_passes_the_honest_check(rng):
    """The kernel a layer runs as: every output within its error bound of the numpy reference."""
    m = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, activation="gelu", seed=0)
    x = rng.standard_normal((1, 8, 16)).astype(np.float32)
    jk, arrays, names = m.to_kernel(x)
    assert "self_attn_in_proj_weight" in names and names["linear1_weight"] == "linear1.weight"
    res = jk.compile(*arrays).simulate(*arrays)
    assert res.ok, res.check
    _close(res.outputs["out"], m(x))


# --- profile --------------------------------------------------------------------------------------

def test_profile_model_times_each_layer(rng):
    m = nn.Transformer(16, 4, 3, dim_feedforward=32, seed=0)
    x = rng.standard_normal((1, 8, 16)).astype(np.float32)
    prof = nn.profile_model(m, x, machine="teach")
    np.testing.assert_array_equal(prof.outputs, m.to("teach")(x))
    assert [layer["name"] for layer in prof.layers] == ["Transformer.layers.0", "Transformer.layers.1",
                                                        "Transformer.layers.2"]
    assert prof.machine.name == "teach" and all(layer["cycles"] > 0 for layer in prof.layers)
    assert prof.layers[1]["start"] == prof.layers[0]["end"] and prof.cycles == prof.layers[-1]["end"]
    assert prof.cycles == sum(layer["cycles"] for layer in prof.layers)
    assert len(prof.kernels) == 1 and prof.kernels[0]["calls"] == 3
    assert abs(sum(o["share"] for o in prof.ops) - 100) < 1e-6 and {"cube", "vector"} <= {u["unit"] for u in prof.units}
    assert any(o["op"].startswith("TMATMUL") for o in prof.ops)
    trace = prof.trace()
    assert max(e.end for e in trace) <= prof.cycles and min(e.start for e in trace if "layers.2" in e.line) \
        >= prof.layers[2]["start"]
    assert prof.as_result().cycles == prof.cycles
    html = prof._repr_html_()
    assert "<svg" in html or "data:image/svg" in html
    assert "Transformer.layers.2" in html and "TransformerEncoderLayer" in prof.summary()
