"""Compiled kernels (Numba; numba.cuda under kernels/cuda). Imported only when a backend asks for them,
so `import refimpl` never imports Numba."""
