"""pypto.optim against torch.optim: the same parameters and gradients, the same updates."""
from __future__ import annotations

import numpy as np
import pytest

from pypto.errors import PyptoError
from pypto.optim import SGD, Adam, AdamW

torch = pytest.importorskip("torch")


class P:
    """A parameter as pypto.nn keeps one: a numpy array `.data` and its `.grad`."""

    def __init__(self, a):
        self.data, self.grad = a, None


def run_both(make_ours, make_torch, steps=5):
    rng = np.random.default_rng(3)
    w0 = [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    ours = [P(w.copy()) for w in w0]
    theirs = [torch.nn.Parameter(torch.tensor(w.copy())) for w in w0]
    opt, topt = make_ours(ours), make_torch(theirs)
    for _ in range(steps):
        grads = [rng.standard_normal(w.shape).astype(np.float32) for w in w0]
        for p, t, g in zip(ours, theirs, grads):
            p.grad, t.grad = g, torch.tensor(g)
        opt.step()
        topt.step()
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [dict(lr=0.1), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, nesterov=True),
                                dict(lr=0.05, momentum=0.5, dampening=0.2, weight_decay=0.01)])
def test_sgd_matches_torch(kw):
    run_both(lambda ps: SGD(ps, **kw), lambda ps: torch.optim.SGD(ps, **kw))


@pytest.mark.parametrize("kw", [dict(lr=0.01), dict(lr=0.02, betas=(0.8, 0.99), weight_decay=0.1)])
def test_adam_matches_torch(kw):
    run_both(lambda ps: Adam(ps, **kw), lambda ps: torch.optim.Adam(ps, **kw))


def test_adamw_matches_torch():
    run_both(lambda ps: AdamW(ps, lr=0.01, weight_decay=0.1), lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1))


def test_plain_arrays_explicit_grads_and_errors():
    w = np.ones(3, np.float32)
    opt = SGD([w], lr=0.5)
    opt.step([np.full(3, 2.0, np.float32)])
    np.testing.assert_array_equal(w, np.zeros(3))
    with pytest.raises(PyptoError, match="another shape"):
        opt.step([np.ones(4)])
    with pytest.raises(PyptoError, match="empty parameter list"):
        SGD([], lr=0.1)
    with pytest.raises(PyptoError, match="Nesterov"):
        SGD([w], nesterov=True)
