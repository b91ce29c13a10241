#!/usr/bin/env python3
"""Writes two tiny Hugging Face model directories with transformers' save_pretrained, and the
logits transformers computes for a fixed batch, for checkpoint/hf_model_test.cc to check that
LoadHfDecoder (checkpoint/hf_model.h) gives the same model.

Run from the repository root:
  python3 tests/golden/gen_hf_golden.py        # (re)writes both directories
Needs: torch, transformers 5.x, safetensors (from PyPI).

The models (weights drawn from torch.manual_seed(SEED); every parameter random, norms and
biases included, so a tensor loaded into the wrong place changes the logits):
  checkpoint/testdata/hf_qwen3_tiny/   Qwen3ForCausalLM, vocab 64, hidden 32, intermediate 64,
      2 layers, 4 heads, 2 KV heads, head_dim 8, q/k norm, tied embeddings, rope_theta 1e6,
      float32, one model.safetensors (without lm_head.weight: it is tied).
  checkpoint/testdata/hf_llama_tiny/   LlamaForCausalLM, the same sizes without head_dim
      (hidden / heads), untied, attention_bias, rms_norm_eps 1e-5, saved in bfloat16 with a
      small max_shard_size: several model-0000i-of-0000n.safetensors and
      model.safetensors.index.json.
  checkpoint/testdata/hf_rope_{llama3,linear,dynamic}_tiny/   LlamaForCausalLM with the same
      sizes, float32, one file, and a scaled rotary embedding (rope_parameters): llama3
      (factor 8, low/high_freq_factor 1/4, original_max_position_embeddings 64, so the head's
      four frequencies fall in each of its three bands), linear (factor 4) and dynamic (factor 2,
      max_position_embeddings 16, shorter than the 24-token inputs, so the base grows). Token ids
      bos 1, eos 2, pad 0. Their input_ids are [2, 24], drawn from the seed.
  tools/testdata/hf_finetune/   for //tools:train_pretrained_test: eval.bin (uint16 tokens,
      8 samples of 24) and expected.json, transformers' mean loss of hf_rope_llama3_tiny over
      those samples (labels = input_ids, as tools/train evaluates a token file).
Each directory also gets expected_logits.safetensors: "input_ids" (int64 [2, 6]) and
"logits" (float32 [2, 6, 64]), computed by transformers (eager attention) from the directory
reloaded with from_pretrained(dtype=torch.float32).
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

SEED = 1234
INPUT_IDS = [[1, 5, 9, 13, 2, 7], [3, 3, 8, 1, 60, 4]]
TESTDATA = "checkpoint/testdata"
MAX_DIR_BYTES = 200 * 1024

SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def randomize(model):
    """Replaces every parameter by a seeded draw: norms around 1, the rest around 0."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))


def write(model, name, dtype, input_ids=None, **save_kwargs):
    out_dir = os.path.join(TESTDATA, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    model = model.to(dtype)
    model.save_pretrained(out_dir, **save_kwargs)

    # The logits of the checkpoint as transformers loads it in float32. (Upcasting `model`
    # instead would keep the rotary inv_freq buffer rounded to `dtype`.)
    model = type(model).from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    if input_ids is None:
        input_ids = torch.tensor(INPUT_IDS, dtype=torch.int64)
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits.to(torch.float32).contiguous()
    save_file(
        {"input_ids": input_ids, "logits": logits},
        os.path.join(out_dir, "expected_logits.safetensors"),
        metadata={"format": "pt"},
    )

    total = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{out_dir}: {sorted(os.listdir(out_dir))}, {total} bytes")
    if total > MAX_DIR_BYTES:
        sys.exit(f"{out_dir} is {total} bytes, over {MAX_DIR_BYTES}: make the model smaller")


def write_rope_models():
    rope_models = {
        "llama3": dict(
            rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64},
            max_position_embeddings=256),
        "linear": dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                        "factor": 4.0}),
        "dynamic": dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                         "factor": 2.0},
                        max_position_embeddings=16),
    }
    for i, (rope_type, kwargs) in enumerate(rope_models.items()):
        torch.manual_seed(SEED + 10 + i)
        llama = LlamaForCausalLM(
            LlamaConfig(**SIZES, tie_word_embeddings=False, rms_norm_eps=1e-5,
                        bos_token_id=1, eos_token_id=2, pad_token_id=0,
                        attn_implementation="eager", **kwargs))
        randomize(llama)
        input_ids = torch.randint(0, SIZES["vocab_size"], (2, 24), dtype=torch.int64)
        write(llama, f"hf_rope_{rope_type}_tiny", torch.float32, input_ids=input_ids)


def write_finetune_golden():
    """eval.bin and transformers' eval loss on it for the llama3-rope model."""
    out_dir = "tools/testdata/hf_finetune"
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(SEED + 20)
    samples, seq_len = 8, 24
    tokens = torch.randint(0, SIZES["vocab_size"], (samples * seq_len,), dtype=torch.int64)
    tokens.to(torch.int16).numpy().astype("<u2").tofile(os.path.join(out_dir, "eval.bin"))
    model = LlamaForCausalLM.from_pretrained(os.path.join(TESTDATA, "hf_rope_llama3_tiny"),
                                             dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ids = tokens.reshape(samples, seq_len)
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump({"model": f"{TESTDATA}/hf_rope_llama3_tiny", "eval_file": "eval.bin",
                   "seq_len": seq_len, "eval_loss": loss}, f, indent=2)
        f.write("\n")
    print(f"{out_dir}: eval_loss {loss!r}")


def main():
    if not os.path.isdir(TESTDATA):
        sys.exit(f"run from the repository root ({TESTDATA} not found)")

    torch.manual_seed(SEED)
    qwen3 = Qwen3ForCausalLM(
        Qwen3Config(
            **SIZES,
            head_dim=8,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            rms_norm_eps=1e-6,
            attn_implementation="eager",
        )
    )
    randomize(qwen3)
    assert qwen3.lm_head.weight.data_ptr() == qwen3.model.embed_tokens.weight.data_ptr()
    write(qwen3, "hf_qwen3_tiny", torch.float32)

    torch.manual_seed(SEED + 1)
    llama = LlamaForCausalLM(
        LlamaConfig(
            **SIZES,
            tie_word_embeddings=False,
            attention_bias=True,
            rms_norm_eps=1e-5,
            attn_implementation="eager",
        )
    )
    randomize(llama)
    write(llama, "hf_llama_tiny", torch.bfloat16, max_shard_size="20KB")
    if not os.path.exists(os.path.join(TESTDATA, "hf_llama_tiny", "model.safetensors.index.json")):
        sys.exit("hf_llama_tiny was written as one file: lower max_shard_size")

    write_rope_models()
    write_finetune_golden()


if __name__ == "__main__":
    main()
