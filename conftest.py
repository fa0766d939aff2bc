"""pytest settings for the whole repository: tests/, tutorials/ and notebooks/ (nbval).

The notebooks print numbers whose last bits depend on the CPU: numpy's matmul goes to OpenBLAS,
which picks its kernels by the CPU it finds (on this project's AMD EPYC machine its Haswell ones,
on an Intel Xeon with AVX-512 its SkylakeX ones: they sum in another order), and numpy picks AVX2
or AVX-512 code for its own loops.  A reference's last bit moves an error the notebooks print
(2.05e-04 or 2.06e-04).  So the stored outputs are made (scripts/run_tutorials.py) and checked
(nbval) with the AVX2 kernels of both, on every x86-64 machine that has AVX2: the variables are
set before any notebook kernel starts, which inherits them.
"""
import os

REPRODUCIBLE = {"OPENBLAS_CORETYPE": "Haswell", "NPY_DISABLE_CPU_FEATURES": "X86_V4,AVX512_ICL,AVX512_SPR"}

os.environ.update(REPRODUCIBLE)
