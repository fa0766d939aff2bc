"""pypto.nn: torch.nn-style models whose forward is written with pypto ops.

    m = pypto.nn.Transformer(d_model=512, nhead=8, num_layers=6)
    y = m(x)                                   # numpy in, numpy out: each layer a simulated kernel
    m.load_state_dict(torch_encoder_state)     # torch's keys, shapes and semantics
    prof = pypto.nn.profile_model(m, x, machine="a2a3")   # cycles per layer and kernel, op shares

See `pypto.nn.module` for how a module runs (inside a trace, or as a kernel of its own on arrays)
and how a parameter reads as a traced tensor (`functional_call`, `bind`).
"""
from .init import manual_seed
from .module import (IncompatibleKeys, Module, Parameter, StateDictError, UnboundParameterError, bind,
                     functional_call)
from .modules import (GELU, Conv2D, Conv2d, Dropout, Embedding, Identity, LayerNorm, Linear, ModuleList,
                      MultiheadAttention, ReLU, RMSNorm, Sequential, Sigmoid, SiLU, Softmax, Tanh, Transformer,
                      TransformerEncoder, TransformerEncoderLayer)
from .profile import ModelProfile, profile_model
from . import init

__all__ = ["Conv2D", "Conv2d", "Dropout", "Embedding", "GELU", "Identity", "IncompatibleKeys", "LayerNorm", "Linear",
           "ModelProfile", "Module", "ModuleList", "MultiheadAttention", "Parameter", "RMSNorm", "ReLU", "Sequential",
           "SiLU", "Sigmoid", "Softmax", "StateDictError", "Tanh", "Transformer", "TransformerEncoder",
           "TransformerEncoderLayer", "UnboundParameterError", "bind", "functional_call", "init", "manual_seed",
           "profile_model"]
