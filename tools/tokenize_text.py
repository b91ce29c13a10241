#!/usr/bin/env python3
"""Turns text into the token files tools/train reads (DataSpec.train_file / eval_file).

Writes OUTPUT, a flat file of little-endian uint16 or uint32 token ids (no header), and
OUTPUT.meta.json beside it:

  {"format": "cpptrain-tokens", "dtype": "uint16", "vocab_size": 50257, "eos_id": 50256,
   "num_tokens": 1048576, "tokenizer": "gpt2/tokenizer.json"}

The loader (trainer/data/token_file_metadata.h) checks it when the data is opened: dtype
against data.token_dtype, num_tokens against the file, vocab_size against the model's.

Tokenizes with Hugging Face's `tokenizers` package (pip install tokenizers) and a
tokenizer.json, e.g. the one in a Hugging Face model directory:

  tools/tokenize_text.py --tokenizer MODEL_DIR --input corpus.txt --output train.bin

Each non-empty line is a document (--split file: each input file is one); the eos token is
appended after every document when the tokenizer has one (--eos-token names it; --no-eos
appends nothing). --dtype auto picks uint16 for vocabularies of at most 65536 tokens.
"""

import argparse
import array
import json
import os
import sys

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[EOS]", "<|end_of_text|>")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True,
                   help="tokenizer.json, or a directory holding one")
    p.add_argument("--input", required=True, nargs="+", help="UTF-8 text files")
    p.add_argument("--output", required=True, help="token file to write")
    p.add_argument("--dtype", choices=("auto", "uint16", "uint32"), default="auto")
    p.add_argument("--split", choices=("line", "file"), default="line",
                   help="what one document is")
    p.add_argument("--eos-token", help="token appended after each document")
    p.add_argument("--no-eos", action="store_true", help="append no eos token")
    p.add_argument("--batch", type=int, default=1024, help="documents encoded at once")
    return p.parse_args(argv)


def fail(message):
    sys.exit("tokenize: " + message)


def load_tokenizer(path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        fail("the `tokenizers` package is missing: pip install tokenizers")
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        fail(f"no tokenizer file at {path}: give a tokenizer.json or a directory holding one")
    return Tokenizer.from_file(path), path


def eos_id(tokenizer, args):
    if args.no_eos:
        return None
    if args.eos_token is not None:
        token_id = tokenizer.token_to_id(args.eos_token)
        if token_id is None:
            fail(f"--eos-token {args.eos_token!r} is not in the tokenizer's vocabulary")
        return token_id
    for token in EOS_CANDIDATES:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return None


def documents(paths, split):
    for path in paths:
        with open(path, encoding="utf-8") as f:
            if split == "file":
                yield f.read()
                continue
            for line in f:
                line = line.rstrip("\n")
                if line.strip():
                    yield line


def batches(items, size):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def main(argv):
    args = parse_args(argv)
    tokenizer, tokenizer_path = load_tokenizer(args.tokenizer)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = args.dtype
    if dtype == "auto":
        dtype = "uint16" if vocab_size <= 1 << 16 else "uint32"
    if dtype == "uint16" and vocab_size > 1 << 16:
        fail(f"vocab_size {vocab_size} does not fit uint16: use --dtype uint32 (or auto)")
    code = "H" if dtype == "uint16" else ("I" if array.array("I").itemsize == 4 else "L")
    eos = eos_id(tokenizer, args)
    tokens = array.array(code)
    for batch in batches(documents(args.input, args.split), args.batch):
        for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
            tokens.extend(encoding.ids)
            if eos is not None:
                tokens.append(eos)
    if sys.byteorder != "little":
        tokens.byteswap()
    temp = args.output + ".tmp"
    with open(temp, "wb") as f:
        tokens.tofile(f)
    os.replace(temp, args.output)
    meta = {"format": "cpptrain-tokens", "dtype": dtype, "vocab_size": vocab_size,
            "eos_id": eos, "num_tokens": len(tokens), "tokenizer": tokenizer_path}
    with open(args.output + ".meta.json.tmp", "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(args.output + ".meta.json.tmp", args.output + ".meta.json")
    print(f"{args.output}: {len(tokens)} tokens ({dtype}, vocab_size {vocab_size}, "
          f"eos_id {eos})")


if __name__ == "__main__":
    main(sys.argv[1:])
