"""The seed script, rewritten for aotpack: export once, then load and generate.

The original (compiling the whole VLM at start-up) hit "skipping cudagraphs due to mutated inputs" and
a segfault:

    model = Gemma3ForConditionalGeneration.from_pretrained("google/gemma-3-4b-it", dtype=torch.bfloat16)
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    outputs = model.generate(**inputs, max_new_tokens=100, cache_implementation="static")

With aotpack the decode step is compiled ahead of time, at build time; prefill (vision tower, image
merge, bidirectional image mask) runs eagerly at run time. Offline, this runs against the
`tiny-gemma3-vlm` preset; pass `--model DIR` with a local google/gemma-3-4b-it checkpoint for the real one.

    python examples/seed_gemma3.py [--model DIR] [--image PATH]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from exporter.config import ExportConfig
from exporter.export import export
from runtime import load
from runtime.inputs import open_images

HERE = Path(__file__).parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-gemma3-vlm", help="preset or a google/gemma-3-4b-it directory")
    p.add_argument("--image", type=Path, default=HERE / "sky.png")
    p.add_argument("--out", type=Path, default=Path("artifacts/seed-gemma3"))
    args = p.parse_args()

    # Build time (CI): export once. A real 4B model is exported in bfloat16, as the seed loads it.
    if not (args.out / "manifest.json").exists():
        dtype = "float32" if args.model == "tiny-gemma3-vlm" else "bfloat16"
        export(ExportConfig(model=args.model, out=args.out, max_cache_len=1024, dtype=dtype))

    # Run time (service): no JIT compile, no network.
    rt = load(args.out)
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "You are a helpful assistant."}]},
        {
            "role": "user",
            "content": [
                {"type": "image", "image": open_images([args.image])[0]},
                {"type": "text", "text": "Describe this image in detail."},
            ],
        },
    ]
    inputs = rt.processor.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_tensors="pt", add_generation_prompt=True
    )
    outputs = rt.generate(**inputs, max_new_tokens=100)
    new = outputs[:, inputs["input_ids"].shape[1] :]
    print(rt.processor.batch_decode(new, skip_special_tokens=True)[0])


if __name__ == "__main__":
    main()
