"""Training with pypto.nn: value_and_grad of a loss of a module against torch's autograd on the
same state dict, and a few optimizer steps against torch's trajectory."""
from __future__ import annotations

import numpy as np
import pytest

import pypto
import pypto.nn as nn
from pypto.errors import PyptoError
from pypto.optim import SGD, Adam

torch = pytest.importorskip("torch")


def to_torch(model, tmodel):
    tmodel.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    return tmodel


def mse(m, x, y):
    d = m(x) - y
    return pypto.sum(pypto.sum(d * d, dim=-1), dim=0, keepdim=True) * (1.0 / x.shape[0])


def data(rng, n=32, d=8):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x, (np.sin(x[:, :1]) * 2 - x[:, 1:2]).astype(np.float32)


def test_mlp_gradients_match_torch_autograd():
    rng = np.random.default_rng(1)
    nn.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
    x, y = data(rng)
    loss, grads = pypto.value_and_grad(mse)(model, x, y)
    tm = to_torch(model, torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)))
    tl = ((tm(torch.tensor(x)) - torch.tensor(y)) ** 2).sum() / x.shape[0]
    tl.backward()
    assert loss == pytest.approx(tl.item(), rel=1e-5)
    assert set(grads) == {k for k, _ in tm.named_parameters()}
    for k, p in tm.named_parameters():
        np.testing.assert_allclose(grads[k], p.grad.numpy(), rtol=1e-4, atol=1e-6)
        assert dict(model.named_parameters())[k].grad is grads[k]


@pytest.mark.parametrize("make_ours,make_torch", [
    (lambda ps: SGD(ps, lr=0.05, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
    (lambda ps: Adam(ps, lr=0.01), lambda ps: torch.optim.Adam(ps, lr=0.01)),
], ids=["sgd", "adam"])
def test_training_steps_follow_torch_and_the_loss_falls(make_ours, make_torch):
    rng = np.random.default_rng(2)
    nn.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    tm = to_torch(model, torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    x, y = data(rng)
    opt, topt = make_ours(model.parameters()), make_torch(tm.parameters())
    vg = pypto.value_and_grad(mse)
    losses, tlosses = [], []
    for _ in range(6):
        loss, _ = vg(model, x, y)
        opt.step()
        topt.zero_grad()
        tl = ((tm(torch.tensor(x)) - torch.tensor(y)) ** 2).sum() / x.shape[0]
        tl.backward()
        topt.step()
        losses.append(loss)
        tlosses.append(tl.item())
    np.testing.assert_allclose(losses, tlosses, rtol=1e-4)
    assert losses[-1] < 0.8 * losses[0]
    for k, v in tm.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[k], v.numpy(), rtol=1e-4, atol=1e-5)
    ck = vg.backward_kernel.compile(*vg.backward_args)     # an ordinary kernel: its cycles per step
    assert ck.simulate(*vg.backward_args, mode="timing").cycles > 0


def test_transformer_layer_gradients_match_torch():
    rng = np.random.default_rng(3)
    nn.manual_seed(3)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
    layer.eval()
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    w = rng.standard_normal((2, 5, 16)).astype(np.float32)

    def loss_fn(m, x, w):
        return pypto.sum(pypto.reshape(m(x) * w, (1, 160)), dim=-1)
    loss, grads = pypto.value_and_grad(loss_fn)(layer, x, w)
    tl_layer = to_torch(layer, torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True))
    tl_layer.eval()
    tl = (tl_layer(torch.tensor(x)) * torch.tensor(w)).sum()
    tl.backward()
    assert loss == pytest.approx(tl.item(), rel=1e-4, abs=1e-4)
    for k, p in tl_layer.named_parameters():
        np.testing.assert_allclose(grads[k], p.grad.numpy(), rtol=2e-3, atol=2e-4, err_msg=k)


def test_value_and_grad_errors():
    with pytest.raises(PyptoError, match="called with a model first"):
        pypto.value_and_grad(mse)(np.zeros(3), np.zeros(3))
    with pytest.raises(pypto.KernelSignatureError, match="needs wrt"):
        @pypto.jit
        def k(x, out):
            out[:] = x * 2.0
        pypto.value_and_grad(k)
