"""What reduced precision costs: a bundle's eager model against the float32 model it was made from.

Owns: the accuracy report of a quantized or bf16/fp16 bundle. Two measurements on a fixed English text
(below, part of aotpack so that every bundle is scored on the same words):
- perplexity of the text under both models (the float32 figure is the reference);
- greedy agreement: the float32 model continues the text's first 32 tokens greedily for 256 tokens;
  the bundle's model reads that same sequence (teacher forcing, so one early difference cannot hide
  the rest) and the figure is the fraction of positions where its argmax is the float32 model's token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from runtime.format.manifest import Accuracy

TEXT = """
The river that runs through the old town was once the reason the town existed at all. Boats carried grain,
wool and timber down to the coast, and the merchants who grew rich on that trade built the stone houses that
still line the water. When the railway arrived, the boats slowly disappeared, and for many years the river
was little more than a view. People walked along its banks on Sunday afternoons, children threw bread to the
ducks, and in hard winters the shallow parts froze so that the brave could skate from one bridge to the next.

Today the river has found a new purpose. A small company rents out canoes in the summer, and a footpath now
follows the water for twenty kilometres, past fields, woods and two villages with good places to eat. The
town council has cleaned the old harbour and turned the warehouses into a library, a market hall and a
museum that tells the story of the trade. Visitors often ask why the bridges are so low. The answer is
simple: the boats that used them had masts that could be lowered, and the bridges were built by people who
wanted to save stone.

Scientists from the university measure the water every month. They count the fish, test how clean the water
is, and record how high it rises after heavy rain. Their reports show that the river is healthier than it
has been for a century. Otters have returned, and last spring a pair of kingfishers nested under the
railway bridge. Not everything is good news. Floods have become more frequent, and twice in the last ten
years the water has reached the market square. The council is now planting trees upstream and letting some
fields flood on purpose, so that the water slows down before it reaches the town.

Most people who live here say that the river is the best thing about the place. It changes with every
season: brown and fast in March, green and slow in July, grey and quiet in November. Old photographs in the
museum show the same view from the same bridge, one hundred years apart, and the most surprising thing is
how little the shape of the water has changed, even though almost everything around it is different.
""".strip()

PROMPT_TOKENS = 32
GREEDY_TOKENS = 256
MAX_TEXT_TOKENS = 512


@dataclass(frozen=True)
class Reference:
    """The float32 model's figures, measured before the model is converted."""

    text_ids: torch.Tensor  # (1, T)
    perplexity: float
    greedy_ids: torch.Tensor  # (1, PROMPT_TOKENS + n): the prompt and the float32 model's continuation


def text_ids(tokenizer, config) -> list[int]:
    """The token ids every bundle of a checkpoint is scored on (and the benchmark scores llama.cpp on)."""
    limit = min(MAX_TEXT_TOKENS, getattr(config.get_text_config(), "max_position_embeddings", MAX_TEXT_TOKENS))
    return tokenizer(TEXT).input_ids[:limit]


def _text_ids(tokenizer, model: nn.Module) -> torch.Tensor:
    return torch.tensor([text_ids(tokenizer, model.config)])  # (1, T)


@torch.inference_mode()
def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    return model(input_ids=ids.to(device)).logits[0].float().cpu()  # (T, vocab)


def _perplexity(model: nn.Module, ids: torch.Tensor) -> float:
    nll = torch.nn.functional.cross_entropy(_logits(model, ids)[:-1], ids[0, 1:])
    return math.exp(nll.item())


@torch.inference_mode()
def reference(model: nn.Module, tokenizer) -> Reference:
    """Score the float32 `model` (before it is converted to the bundle's dtype or quantized)."""
    ids = _text_ids(tokenizer, model)
    prompt = ids[:, :PROMPT_TOKENS].to(next(model.parameters()).device)
    greedy = model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=GREEDY_TOKENS,
        min_new_tokens=GREEDY_TOKENS,
        do_sample=False,
    )
    return Reference(ids, _perplexity(model, ids), greedy.cpu())


def accuracy(model: nn.Module, ref: Reference) -> Accuracy:
    """The converted model against the float32 reference."""
    prompt = min(PROMPT_TOKENS, ref.text_ids.shape[1])
    chosen = _logits(model, ref.greedy_ids)[prompt - 1 : -1].argmax(-1)  # (n,): its pick at each continuation slot
    expected = ref.greedy_ids[0, prompt:]
    return Accuracy(
        text_tokens=ref.text_ids.shape[1],
        perplexity=round(_perplexity(model, ref.text_ids), 4),
        reference_perplexity=round(ref.perplexity, 4),
        greedy_tokens=expected.numel(),
        greedy_agreement=round((chosen == expected).float().mean().item(), 4),
    )
