"""The kernels and their code generation: what a block op runs as on an engine.

``fast.prepare(op)`` picks once per op how the CPU engines run it (BLAS through ``gemm``,
gathers, generated C through ``ccodegen``/``cbuild``/``native``, the numpy interpreter);
``epilogue`` and ``rowfuse`` (with ``crows``) run the fused tasks lower/fusion.py makes;
``reference`` is the oracle's kernel; ``triton`` generates the GPU engine's joins.
"""
