"""Optimizers with torch.optim's names and update rules: `SGD` (momentum, dampening, Nesterov,
weight decay) and `Adam` (with `AdamW`'s decoupled weight decay as an option).

They update parameters on the host, in numpy (the optimizer state lives with the model, not on
the simulated device): a parameter is anything with a numpy array `.data` (a
`pypto.nn.Parameter`) or a numpy array itself, and its gradient is `.grad` (set by
`pypto.value_and_grad` on a module), or given to `step(grads)` as a list in the same order.
"""
from __future__ import annotations

import numpy as np

from .errors import PyptoError


def _array(p) -> np.ndarray:
    a = p if isinstance(p, np.ndarray) else getattr(p, "data", p)
    if not isinstance(a, np.ndarray):
        raise PyptoError("an optimizer takes parameters: pypto.nn.Parameter or numpy arrays",
                         expected="model.parameters()", got=type(p).__name__)
    return a


class Optimizer:
    def __init__(self, params, defaults: dict):
        self.params = list(params)
        if not self.params:
            raise PyptoError("an optimizer got an empty parameter list", expected="model.parameters()", got="[]")
        for p in self.params:
            _array(p)
        self.defaults = dict(defaults)
        self.state: list[dict] = [{} for _ in self.params]
        self.steps = 0

    def zero_grad(self) -> None:
        for p in self.params:
            if hasattr(p, "grad"):
                p.grad = None

    def _grads(self, grads):
        if grads is None:
            grads = [getattr(p, "grad", None) for p in self.params]
        grads = list(grads)
        if len(grads) != len(self.params):
            raise PyptoError("step(grads): one gradient per parameter", expected=len(self.params), got=len(grads))
        for p, g in zip(self.params, grads):
            if g is not None and np.shape(g) != _array(p).shape:
                raise PyptoError("a gradient of another shape than its parameter", expected=_array(p).shape,
                                 got=np.shape(g))
        return grads

    def step(self, grads=None) -> None:
        """One update of every parameter with a gradient (those without one are left alone)."""
        grads = self._grads(grads)
        self.steps += 1
        for p, g, st in zip(self.params, grads, self.state):
            if g is not None:
                a = _array(p)
                a[...] = self._update(a.astype(np.float64), np.asarray(g, np.float64), st).astype(a.dtype)

    def _update(self, w, g, st):  # pragma: no cover - abstract
        raise NotImplementedError


class SGD(Optimizer):
    """w -= lr * v, v = momentum * v + (1 - dampening) * (g + weight_decay * w) (torch.optim.SGD)."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise PyptoError("SGD: Nesterov momentum needs momentum > 0 and no dampening",
                             expected="momentum > 0, dampening = 0", got=f"momentum={momentum}, dampening={dampening}")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))
        self.lr, self.momentum, self.dampening = lr, momentum, dampening
        self.weight_decay, self.nesterov = weight_decay, nesterov

    def _update(self, w, g, st):
        if self.weight_decay:
            g = g + self.weight_decay * w
        if self.momentum:
            v = st.get("v")
            v = g.copy() if v is None else self.momentum * v + (1 - self.dampening) * g
            st["v"] = v
            g = g + self.momentum * v if self.nesterov else v
        return w - self.lr * g


class Adam(Optimizer):
    """Adam (torch.optim.Adam): bias-corrected first and second moments; `decoupled=True` is
    AdamW (the decay applied to the weight, not added to the gradient)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled: bool = False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      decoupled=decoupled))
        self.lr, self.betas, self.eps = lr, tuple(betas), eps
        self.weight_decay, self.decoupled = weight_decay, decoupled

    def _update(self, w, g, st):
        b1, b2 = self.betas
        if self.weight_decay and not self.decoupled:
            g = g + self.weight_decay * w
        if self.weight_decay and self.decoupled:
            w = w * (1 - self.lr * self.weight_decay)
        t = st["t"] = st.get("t", 0) + 1
        m = st["m"] = b1 * st.get("m", 0.0) + (1 - b1) * g
        v = st["v"] = b2 * st.get("v", 0.0) + (1 - b2) * g * g
        mhat, vhat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        return w - self.lr * mhat / (np.sqrt(vhat) + self.eps)


def AdamW(params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2) -> Adam:
    """Adam with decoupled weight decay (torch.optim.AdamW)."""
    return Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, decoupled=True)
