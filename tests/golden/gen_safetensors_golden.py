#!/usr/bin/env python3
"""Writes checkpoint/testdata/golden.safetensors with Hugging Face's safetensors, for the C++
reader test (checkpoint/safetensors_test.cc) to check against the same formulas; and, with
--check, verifies that Python's safetensors loads a file written by the C++ writer.

Run from the repository root:
  python3 tests/golden/gen_safetensors_golden.py            # (re)writes the golden file
  python3 tests/golden/gen_safetensors_golden.py --check PATH
Needs: torch, safetensors (from PyPI).

The tensors (keep in sync with GoldenTensors() in checkpoint/safetensors_test.cc):
  f64    [5]     arange(5) / 3                         float64
  f32    [3, 4]  (arange(12) - 5) * 0.25               float32
  bf16   [2, 8]  arange(16, float32) * 0.1 -> bfloat16
  f16    [4, 2]  (arange(8, float32) - 3.5) * 0.3 -> float16
  i64    [2, 3]  arange(6) * 1000000007 - 3            int64
  i32    [4]     arange(4) * -7                        int32
  i16    [3]     (arange(3) - 1) * 300                 int16
  i8     [4]     60 - arange(4) * 40                   int8
  u8     [5]     arange(5) * 50                        uint8
  bool   [6]     arange(6) % 3 == 0                    bool
  scalar []      2.5                                   float32
  empty  [0, 3]  (no elements)                         float32
and __metadata__ {"format": "pt"}.
"""
import argparse
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save, save_file

GOLDEN_PATH = "checkpoint/testdata/golden.safetensors"
METADATA = {"format": "pt"}


def golden_tensors():
    def arange(n, dtype=torch.int64):
        return torch.arange(n, dtype=dtype)

    return {
        "f64": arange(5, torch.float64) / 3,
        "f32": ((arange(12, torch.float32) - 5) * 0.25).reshape(3, 4),
        "bf16": (arange(16, torch.float32) * 0.1).to(torch.bfloat16).reshape(2, 8),
        "f16": ((arange(8, torch.float32) - 3.5) * 0.3).to(torch.float16).reshape(4, 2),
        "i64": (arange(6) * 1000000007 - 3).reshape(2, 3),
        "i32": (arange(4) * -7).to(torch.int32),
        "i16": ((arange(3) - 1) * 300).to(torch.int16),
        "i8": (60 - arange(4) * 40).to(torch.int8),
        "u8": (arange(5) * 50).to(torch.uint8),
        "bool": arange(6) % 3 == 0,
        "scalar": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
    }


def check(path):
    """Loads `path` with Python's safetensors and compares it with the golden tensors."""
    expected = golden_tensors()
    loaded = load_file(path)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    errors = []
    if sorted(loaded) != sorted(expected):
        errors.append(f"tensor names {sorted(loaded)}, expected {sorted(expected)}")
    for name, want in expected.items():
        got = loaded.get(name)
        if got is None:
            continue
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            errors.append(f"tensor {name!r}: got {got.dtype} {tuple(got.shape)} {got.flatten()[:8]}, "
                          f"expected {want.dtype} {tuple(want.shape)} {want.flatten()[:8]}")
    if metadata != METADATA:
        errors.append(f"metadata {metadata}, expected {METADATA}")
    if errors:
        print(f"FAIL: {path}:", *errors, sep="\n  ")
        return 1
    with open(path, "rb") as f:
        identical = f.read() == save(loaded, metadata=metadata)
    print(f"OK: safetensors {__import__('safetensors').__version__} loads {path}: "
          f"{len(loaded)} tensors and metadata as expected; byte-identical to Python's own "
          f"save(): {identical}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", metavar="PATH", help="verify a file written by the C++ writer")
    args = parser.parse_args()
    if args.check:
        return check(args.check)
    save_file(golden_tensors(), GOLDEN_PATH, metadata=METADATA)
    print(f"wrote {GOLDEN_PATH} ({os.path.getsize(GOLDEN_PATH)} bytes)")
    return check(GOLDEN_PATH)


if __name__ == "__main__":
    sys.exit(main())
