#!/usr/bin/env python3
"""Writes what transformers' generate does on the tiny Hugging Face directories under
checkpoint/testdata (saved by gen_hf_golden.py and gen_hf_arch_golden.py with save_pretrained),
for tests/golden/hf_generate_test.cc to check the generation room (generation/generate.h)
against it, and what transformers' sampling filters keep, for the same test to check
generation/sampling.h.

Run from the repository root:
  python3 tests/golden/gen_hf_generate_golden.py  # (re)writes tests/golden/hf_generate_golden.safetensors
Needs: torch, transformers 5.x, safetensors (from PyPI).

The tensors:
"prompt.I" (int64): PROMPTS[I].
"greedy.DIR" (int64 [2, 20]): for directory DIR, each prompt of PROMPTS: the 20 tokens of
  model.generate(prompt, do_sample=False, max_new_tokens=20) with the directory reloaded by
  from_pretrained(dtype=torch.float32, attn_implementation="eager"), eos_token_id cleared so that
  every completion has all 20 tokens (generate's KV cache on, as by default: 4 + 20 tokens run
  past every sliding window, past hf_rope_dynamic_tiny's max_position_embeddings 16 and past
  the longrope directories' original_max_position_embeddings 8).
"filter.logits" (float32 [3, 64], drawn from torch.manual_seed(SEED) times 3) and for case I
  of FILTER_CASES "filter.I.options" (float64 [3]: temperature, top_k, top_p), "filter.I.kept"
  (int64 [3, 64]: 1 where a token keeps a finite score after transformers'
  TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper, in generate's order) and
  "filter.I.probs" (float32 [3, 64]: softmax of the filtered scores).
"""
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import (TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

SEED = 4321
TESTDATA = "checkpoint/testdata"
OUT = "tests/golden/hf_generate_golden.safetensors"
PROMPTS = [[3, 17, 42, 8], [1, 5, 9, 13, 2, 7]]
MAX_NEW_TOKENS = 20
FILTER_CASES = [
    dict(temperature=1.0, top_k=0, top_p=1.0),
    dict(temperature=0.7, top_k=0, top_p=1.0),
    dict(temperature=1.0, top_k=5, top_p=1.0),
    dict(temperature=1.0, top_k=0, top_p=0.9),
    dict(temperature=0.5, top_k=10, top_p=0.8),
    dict(temperature=2.0, top_k=50, top_p=0.3),
    dict(temperature=1.0, top_k=0, top_p=0.01),
]


def greedy():
    out = {}
    for name in sorted(os.listdir(TESTDATA)):
        path = os.path.join(TESTDATA, name)
        if not (name.startswith("hf_") and name.endswith("_tiny")):
            continue
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     attn_implementation="eager")
        model.eval()
        model.generation_config.eos_token_id = None
        completions = []
        for prompt in PROMPTS:
            ids = torch.tensor([prompt], dtype=torch.int64)
            with torch.no_grad():
                tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                        max_new_tokens=MAX_NEW_TOKENS, pad_token_id=0)
            completions.append(tokens[0, ids.size(1):])
            assert completions[-1].numel() == MAX_NEW_TOKENS, (name, completions[-1])
        out[f"greedy.{name}"] = torch.stack(completions).contiguous()
        print(name, out[f"greedy.{name}"].tolist())
    return out


def filters():
    torch.manual_seed(SEED)
    logits = torch.randn(3, 64) * 3
    out = {"filter.logits": logits}
    for i, case in enumerate(FILTER_CASES):
        scores = logits.clone()
        if case["temperature"] != 1.0:
            scores = TemperatureLogitsWarper(case["temperature"])(None, scores)
        if case["top_k"] > 0:
            scores = TopKLogitsWarper(case["top_k"])(None, scores)
        if case["top_p"] < 1.0:
            scores = TopPLogitsWarper(case["top_p"])(None, scores)
        kept = torch.isfinite(scores)
        out[f"filter.{i}.options"] = torch.tensor(
            [case["temperature"], case["top_k"], case["top_p"]], dtype=torch.float64)
        out[f"filter.{i}.kept"] = kept.to(torch.int64)
        out[f"filter.{i}.probs"] = torch.softmax(scores, -1).contiguous()
    return out


def main():
    golden = {f"prompt.{i}": torch.tensor(p, dtype=torch.int64) for i, p in enumerate(PROMPTS)}
    golden.update(greedy())
    golden.update(filters())
    save_file(golden, OUT, metadata={"format": "pt"})
    print(f"wrote {OUT}: {len(golden)} tensors, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
