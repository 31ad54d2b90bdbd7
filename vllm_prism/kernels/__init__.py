"""GPU kernels of vllm-prism (Triton first), free of vLLM imports.

:mod:`vllm_prism.kernels.pq2` holds the ternary linear op: ``PQ2Weight`` / ``PTQ1Weight``
(prepared layouts), ``pq2_linear`` (kernel dispatch by M, shape and GPU) and the signed
block Hadamard producer. Importing this package imports torch but compiles nothing.
"""
