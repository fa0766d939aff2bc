"""Package-level promises: light imports, the public names of DESIGN.md section 5."""
import subprocess
import sys

import pypto

HEAVY = ("IPython", "ipywidgets", "matplotlib", "graphviz")


def test_import_pypto_loads_no_notebook_libraries():
    code = ("import sys, pypto; heavy = %r; "
            "print(','.join(m for m in heavy if m in sys.modules))" % (HEAVY,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_api_names_exist():
    for name in ("jit", "set_vec_tile_shapes", "set_cube_tile_shapes", "matmul", "amax", "amin", "sum",
                 "mean", "exp", "cast", "transpose", "reshape", "softmax", "rms_norm", "view", "assemble",
                 "loop", "Tensor", "explore", "DT_FP32", "DT_FP16", "DT_BF16", "DT_INT8", "DT_INT32",
                 "PyptoError", "Program"):
        assert hasattr(pypto, name), name


def test_errors_are_pypto_errors():
    for cls in (pypto.TileShapeError, pypto.ShapeError, pypto.DTypeError, pypto.KernelSignatureError,
                pypto.SimulationError, pypto.VerificationError, pypto.MagicUsageError):
        assert issubclass(cls, pypto.PyptoError)


def test_import_leaves_ml_dtypes_for_bf16():
    """ml_dtypes (about a second to import) comes with the first bf16 kernel, not with pypto."""
    import subprocess
    import sys
    code = ("import sys, numpy as np, pypto\n"
            "assert 'ml_dtypes' not in sys.modules\n"
            "@pypto.jit\n"
            "def k(x, out):\n"
            "    out[:] = pypto.exp(x)\n"
            "x = np.ones((8, 64), np.float32); o = np.zeros_like(x); k(x, o)\n"
            "assert 'ml_dtypes' not in sys.modules and abs(o[0, 0] - np.e) < 1e-6\n"
            "import ml_dtypes\n"
            "xb = x.astype(ml_dtypes.bfloat16); ob = np.zeros_like(xb); k(xb, ob)\n"
            "assert pypto.DT_BF16.np_dtype == np.dtype(ml_dtypes.bfloat16) and float(ob[0, 0]) == 2.71875\n")
    subprocess.run([sys.executable, "-c", code], check=True)
