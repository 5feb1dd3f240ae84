"""The eager side of a bundle, over torch and transformers: the model built from the bundle's weights,
its KV cache (views transformers writes through), the decode-step masks, the traced step itself, the
eager prefill, and each cache row's step inputs.
"""
