#!/usr/bin/env python3
"""Checks that a model directory written by the C++ side loads into transformers with its logits.

  python3 tests/golden/check_hf_export.py DIR

DIR holds config.json and model.safetensors (written by checkpoint/hf_model_test.cc's export
tests with CPPTRAIN_HF_EXPORT_DIR=DIR) and expected_logits.safetensors: the input_ids and the
C++ fp32 logits. Loads DIR with AutoModelForCausalLM.from_pretrained in fp32, computes the logits
of the same input_ids, prints the largest absolute difference, and exits 1 when it is 1e-4 or
more (or when transformers reports missing or unexpected weights).
"""

import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TOLERANCE = 1e-4


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} DIR", file=sys.stderr)
        return 2
    directory = argv[1]
    expected = load_file(f"{directory}/expected_logits.safetensors")
    model, info = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True)
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    if problems:
        print(f"{directory}: transformers reported loading problems: {problems}")
        return 1
    with torch.no_grad():
        logits = model(input_ids=expected["input_ids"]).logits
    want = expected["logits"]
    if logits.shape != want.shape:
        print(f"{directory}: logits shape {tuple(logits.shape)}, expected {tuple(want.shape)}")
        return 1
    max_diff = (logits.float() - want).abs().max().item()
    print(f"{directory}: {type(model).__name__}, logits {tuple(logits.shape)}, "
          f"max abs difference vs C++ {max_diff:.3e} (tolerance {TOLERANCE:g})")
    return 0 if max_diff < TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
