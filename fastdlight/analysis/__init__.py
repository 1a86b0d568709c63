"""What a PrimFunc is, read once and shared by the policies and the templates.

* :mod:`.func_info` – :func:`analyze` / :class:`FuncInfo`: blocks, axes, accesses, the family.
* :mod:`.prepare` – specializing symbolic dims, checking the target, parameter shapes.
* :mod:`.matmul_match` – what is a matmul (the normalized ``C[S, I, J] += A[S, I, K] * B[S, J, K]`` view).
* :mod:`.wgmma_match`, :mod:`.wgmma_view`, :mod:`.wgmma_conv` – the Hopper template's operand views.
* :mod:`.dtypes` – bytes per element.
"""
