"""What a bundle is, readable without torch: file names, the cache layout, the quantization spec, the
versioned manifest, the decode step's signature, reading and checking a bundle directory, signatures
and the `inspect` summary.

Nothing in this package imports torch or transformers (tested), so `aotpack inspect` and the hash and
signature part of `aotpack verify` run on a machine that has neither.
"""
