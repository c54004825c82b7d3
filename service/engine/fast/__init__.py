"""The project's own decode engine (``HYMT_ENGINE=fast``): the Hugging Face model's weights run by
a step loop of our own over a paged KV cache, with the decode step replayed as CUDA graphs.

``weights`` takes the weights out of the transformers model (fused, optionally FP8), ``cache``
owns the paged KV cache and its pages, ``attention`` the prefill and paged decode kernels,
``gemv`` and ``rope`` the engine's own kernels for a lone request's projections and for RoPE
with the cache writes (``launch`` how they are launched), ``forward`` the transformer itself,
``sampler`` the choice of tokens on the device, ``batch`` the per-row state kept on the device,
``graphs`` the captured decode steps, ``plan`` what of all this the settings take on a device, and
``engine`` the step loop behind the engine contract.
"""
