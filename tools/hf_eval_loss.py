#!/usr/bin/env python3
"""transformers' mean loss of a model directory over a token file, checked against a value.

  python3 tools/hf_eval_loss.py DIR TOKENS SEQ_LEN EXPECTED_LOSS

Loads DIR with AutoModelForCausalLM.from_pretrained in fp32 (eager attention; an error when
transformers reports missing or unexpected weights), cuts TOKENS (uint16, little-endian) into
samples of SEQ_LEN as tools/train does, and computes the loss with labels = input_ids. Prints
both values and exits 1 when they differ by 1e-5 or more. Used by tools/train_pretrained_test.sh
on what `ckpt to-full` wrote from a checkpoint of tools/train.
"""
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

TOLERANCE = 1e-5


def main(argv):
    if len(argv) != 5:
        print(f"usage: {argv[0]} DIR TOKENS SEQ_LEN EXPECTED_LOSS", file=sys.stderr)
        return 2
    directory, tokens_path, seq_len, expected = argv[1], argv[2], int(argv[3]), float(argv[4])
    model, info = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        print(f"{directory}: transformers reported loading problems: {problems}")
        return 1
    model.eval()
    tokens = np.fromfile(tokens_path, dtype="<u2").astype(np.int64)
    samples = len(tokens) // seq_len
    ids = torch.from_numpy(tokens[: samples * seq_len]).reshape(samples, seq_len)
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    diff = abs(loss - expected)
    print(f"{directory}: {type(model).__name__}, transformers loss {loss:.8f}, expected "
          f"{expected:.8f}, difference {diff:.2e} (tolerance {TOLERANCE:g})")
    return 0 if diff < TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
