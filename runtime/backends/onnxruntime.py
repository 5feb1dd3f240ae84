"""The `onnxruntime` backend: the portable decode step, decode.onnx, run by ONNX Runtime.

Owns: whether the bundle carries decode.onnx (`export --onnx`), the ONNX Runtime session, lending it
the eager model's weight tensors, and one decode call: the same inputs and checks as the compiled step
(runtime.backends.checks), the outputs written by ONNX Runtime
straight into torch tensors (I/O binding), then the new keys and values written into the cache, which
the graph cannot do itself (ONNX keeps no in-place update of an input).

One copy of the weights: each weight initializer is lent from the eager model as an OrtValue over the
same memory (`add_initializer`), and prepacking is off by default, since ONNX Runtime's MatMul prepacks
a constant weight into a layout of its own, a second copy of every weight. `prepack=True` trades that
copy for speed (measured in the README).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from runtime.backends.base import Backend, checked_each_call, every_batch
from runtime.backends.checks import check_step_inputs, lend_constants
from runtime.errors import BundleError
from runtime.format.contract import DecodeContract
from runtime.format.files import DECODE_ONNX, read_verified
from runtime.format.manifest import Manifest
from runtime.model.cache import write_token

_NUMPY = {torch.float32: np.float32, torch.int64: np.int64, torch.bool: np.bool_}
_ORT_TYPES = {"float32": "tensor(float)", "bfloat16": "tensor(bfloat16)", "float16": "tensor(float16)"}


class OnnxRuntimeDecode:
    """decode.onnx through ONNX Runtime, called like CompiledDecode:
    input_ids (b, 1), position_ids (b, 1), cache_position (b,), pad_mask (b, L), kv -> logits (b, vocab)."""

    def __init__(self, path: Path, model: nn.Module, manifest: Manifest, sha256: str | None = None, prepack=False):
        import onnxruntime as ort  # only this backend pays its import

        self.contract = DecodeContract.of(manifest)
        self.batches = every_batch(self.contract)  # one graph, batch dynamic
        self.verify_batches = ()  # decode.onnx has no verify step: the engine decodes without drafts
        self.chunk_tokens = 0  # nor a chunk graph: prompts go in through the eager model
        self.inputs, self.outputs = self.contract.onnx_names()
        options = _session_options(ort, prepack)
        # The graph comes from verified bytes; its external weights name files of this folder (validated,
        # then never read: every one is lent below).
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(Path(path).parent))
        lent = lend_constants(model, manifest.onnx.initializers, manifest.device)
        # Kept as long as the session: ONNX Runtime reads the OrtValues' memory, it holds no reference.
        self._lent = {name: ort.OrtValue.ortvalue_from_numpy(tensor.numpy()) for name, tensor in lent.items()}
        for name, value in self._lent.items():
            options.add_initializer(name, value)
        try:
            self._session = ort.InferenceSession(read_verified(Path(path), sha256), options, ["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's own exception types (Fail, InvalidGraph, ...)
            raise BundleError(f"{Path(path).name} could not be loaded ({str(e)[:300]}); re-export the bundle") from None
        self.vocab_size = manifest.vocab_size
        self._check_signature()
        self._check_outputs()
        self.contract.check_package(self._session.get_modelmeta().custom_metadata_map, Path(path).name)

    def _check_signature(self) -> None:
        found = ([i.name for i in self._session.get_inputs()], [o.name for o in self._session.get_outputs()])
        if found != (self.inputs, self.outputs):
            raise BundleError(
                f"decode.onnx takes {found[0][:6]}... and returns {found[1][:4]}..., not the manifest's "
                "decode signature; the bundle is inconsistent, re-export it"
            )

    def _check_outputs(self) -> None:
        """Each output's element type and fixed sizes, before any step: ONNX Runtime would only fail at the
        first step (a raw RuntimeError, failing every request in it) when a rehashed graph returns others."""
        expected = [("tensor(float)", ("batch", self.vocab_size))] + [
            (_ORT_TYPES[self.contract.dtype], ("batch", shape[1], 1, shape[3])) for shape in self.contract.kv_shapes(1)
        ]
        for output, (dtype, dims) in zip(self._session.get_outputs(), expected, strict=True):
            shape = output.shape
            fixed_ok = len(shape) == len(dims) and all(
                not isinstance(f, int) or not isinstance(d, int) or f == d for f, d in zip(shape, dims, strict=True)
            )
            if output.type != dtype or not fixed_ok:
                raise BundleError(
                    f"decode.onnx's output {output.name!r} is {output.type} {list(shape)}, where the manifest's "
                    f"decode signature needs {dtype} {list(dims)}; the bundle is inconsistent, re-export it"
                )

    def __call__(self, input_ids, position_ids, cache_position, pad_mask, kv: list[torch.Tensor]) -> torch.Tensor:
        inputs = [input_ids, position_ids, cache_position, pad_mask, *kv]
        # ONNX Runtime would check shapes, but not a position outside the cache
        check_step_inputs(self.contract, inputs, None, self.verify_batches)
        batch = input_ids.shape[0]
        logits = torch.empty(batch, self.vocab_size)  # (b, vocab)
        written = [torch.empty(batch, s[1], 1, s[3], dtype=kv[0].dtype) for s in self.contract.kv_shapes(batch)]
        binding = self._session.io_binding()
        for name, tensor in zip(self.inputs, inputs, strict=True):
            _bind(binding.bind_input, name, tensor)
        for name, tensor in zip(self.outputs, [logits, *written], strict=True):
            _bind(binding.bind_output, name, tensor)
        self._session.run_with_iobinding(binding)
        for i, layer in enumerate(self.contract.layout):  # (b, kv_heads, 1, head_dim) each
            write_token(kv[2 * i], kv[2 * i + 1], layer, cache_position, written[2 * i], written[2 * i + 1])
        return logits

    def bind(self, input_ids, position_ids, cache_position, kv: list[torch.Tensor]):
        return checked_each_call(self, input_ids, position_ids, cache_position, kv)


def _bind(bind, name: str, tensor: torch.Tensor) -> None:
    """Bind ONNX Runtime's input or output `name` to the tensor's own memory: nothing is copied."""
    bind(name, "cpu", 0, _NUMPY[tensor.dtype], tuple(tensor.shape), tensor.data_ptr())


def _session_options(ort, prepack: bool):
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # the same threads as the eager prefill
    options.inter_op_num_threads = 1
    # Its threads would spin between runs, on the cores torch's prefill and sampling need next (Gemma 3
    # 270M, 2 cores: 60 ms a step instead of 65, and a shorter prefill, without spinning).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: it warns about every initializer lent
    options.add_session_config_entry("session.disable_prepacking", "0" if prepack else "1")
    return options


class OnnxRuntimeBackend(Backend):
    """Runs on any torch and CPU: ONNX Runtime's own kernels, no compiled code of the bundle's."""

    name = "onnxruntime"

    def files(self, manifest) -> tuple[str, ...]:
        return (DECODE_ONNX,)

    def check_bundle(self, manifest, bundle: Path) -> None:
        """Only a bundle exported with --onnx has one."""
        if manifest.onnx is None:
            raise BundleError(
                f"{bundle} has no ONNX decode; re-export it with `aotpack export ... --onnx`, or load it with "
                "backend='aoti'"
            )

    def open(self, bundle: Path, model, manifest, config) -> OnnxRuntimeDecode:
        return OnnxRuntimeDecode(bundle / DECODE_ONNX, model, manifest, manifest.files[DECODE_ONNX], config.prepack)


BACKEND = OnnxRuntimeBackend()
