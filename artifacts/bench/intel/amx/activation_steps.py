"""Perplexity of Gemma 3 270M (or any checkpoint folder, argv[1]) on the accuracy text with int8 weights
(one scale per row) and activations rounded to int8 per block of 32, 64, 128 or 256 columns, or per row,
in float arithmetic: what one activation step per row (what AMX's int8 tiles would need) costs.
Run from the repository root: python artifacts/bench/intel/amx/activation_steps.py CHECKPOINT"""

import math
import sys

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from exporter.accuracy import text_ids


def weight_grid(w: torch.Tensor) -> torch.Tensor:
    step = w.abs().amax(1, keepdim=True).clamp(min=1e-30) / 127
    return torch.round(w / step).clamp(-127, 127) * step


def rounded(x: torch.Tensor, block: int | None) -> torch.Tensor:
    """x with each block of `block` columns (None: each row) rounded to 127 steps of its largest value."""
    k = x.shape[-1]
    block = block or k
    pad = (-k) % block
    v = nn.functional.pad(x.reshape(-1, k), (0, pad)).reshape(-1, (k + pad) // block, block)
    step = v.abs().amax(-1, keepdim=True) / 127
    q = torch.round(v / step.clamp(min=1e-30)).clamp(-127, 127) * step
    return q.reshape(-1, k + pad)[:, :k].reshape(x.shape)


class Rounded(nn.Module):
    block: int | None = None  # set for every layer at once, below

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = weight_grid(linear.weight.data.float()), linear.bias

    def forward(self, x):
        return nn.functional.linear(rounded(x, Rounded.block), self.weight, self.bias)


def main(path: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([text_ids(tokenizer, model.config)])

    @torch.inference_mode()
    def perplexity() -> float:
        logits = model(input_ids=ids).logits[0]
        return math.exp(nn.functional.cross_entropy(logits[:-1], ids[0, 1:]).item())

    base = perplexity()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Rounded(child))
    print(f"fp32 {base:.4f}")
    for block in (32, 64, 128, 256, None):
        Rounded.block = block
        p = perplexity()
        print(f"{block or 'row'} {p:.4f} {100 * (p / base - 1):+.2f}%", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
