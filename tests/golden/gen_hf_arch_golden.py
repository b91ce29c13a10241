#!/usr/bin/env python3
"""Writes tiny Hugging Face model directories of the architectures beyond Llama and Qwen3 with
transformers' save_pretrained, and what transformers computes on them, for
checkpoint/hf_arch_test.cc to check that LoadHfDecoder (checkpoint/hf_model.h) builds the same
model: the same logits, the same loss, and the same losses over 20 AdamW steps.

Run from the repository root:
  python3 tests/golden/gen_hf_arch_golden.py        # (re)writes the directories below
Needs: torch, transformers 5.x, safetensors (from PyPI).

Every model has vocab 64, hidden 32, intermediate 64, 2 layers, 4 heads, 2 KV heads (head_dim
hidden / heads = 8), float32, one model.safetensors, and every parameter random (norms and
biases included, gen_hf_golden.py's randomize), so a tensor loaded into the wrong place changes
the logits. Under checkpoint/testdata/:
  hf_qwen2_tiny/           Qwen2ForCausalLM (q/k/v biases, no o_proj bias), untied,
                           use_sliding_window false (Qwen2's default), rope_theta 1e6.
  hf_qwen2_tied_tiny/      the same with tied embeddings (no lm_head.weight in the file).
  hf_qwen2_sliding_tiny/   use_sliding_window true, sliding_window 4, max_window_layers 1: layer 0
                           attends to the whole prefix, layer 1 through the window.
  hf_llama_mlp_bias_tiny/  LlamaForCausalLM with mlp_bias (gate/up/down biases), untied.
  hf_mistral_tiny/         MistralForCausalLM, sliding_window 4 in every layer, untied.
  hf_qwen3_sliding_tiny/   Qwen3ForCausalLM (q/k norm, head_dim 8, tied) with
                           use_sliding_window true, sliding_window 5, max_window_layers 1.
  hf_rope_yarn_tiny/       Qwen2ForCausalLM with Qwen2.5's yarn (factor 4) over a pretraining
                           length of 16, so that the frequencies span yarn's ramp.
  hf_rope_longrope_tiny/   LlamaForCausalLM with longrope, pretraining length 8 < 12 tokens (the
                           long factors; not in hf_arch_eval: transformers' cached generation
                           keeps the short-factor keys of the first 8 tokens).
  hf_phi3_tiny/            Phi3ForCausalLM (qkv_proj, gate_up_proj), longrope with the pretraining
                           length 8 at the top level, sliding_window 6, untied.
  hf_phi3_partial_tiny/    the same with partial_rotary_factor 0.5 and no window (4 of 8
                           dimensions turn).
  hf_gemma2_tiny/          Gemma2ForCausalLM: head_dim 8, query_pre_attn_scalar 16, attention
                           soft-capping 2, final soft-capping 3, layer 0 sliding (window 4),
                           layer 1 global, tied.
  hf_gemma3_tiny/          Gemma3ForCausalLM (gemma3_text): QK-norm, layer 0 sliding (window 4,
                           rope base 10000), layer 1 global (linear factor 2 over base 1e6).
  hf_rope_init/            NAME.json configs at real sizes (Qwen2.5 yarn in 4.x's rope_scaling,
                           yarn with mscale / attention_factor, longrope, Phi-3's "su") and
                           golden.safetensors, transformers' rope init function on each.
And tools/testdata/hf_arch_eval/ for //tools:train_arch_test: eval.bin (uint16 tokens, 8 samples
of 24, longer than the windows) and expected.json, transformers' mean loss of each directory
over those samples (labels = input_ids, as tools/train evaluates a token file) and its greedy
completion of GENERATE_PROMPT (generate with do_sample=False, max_new_tokens=20, stopping at the
directory's eos_token_id as tools/generate does; 24 tokens in all, longer than the windows).
Each directory also gets expected_logits.safetensors, computed by transformers (eager attention)
from the directory reloaded with from_pretrained(dtype=torch.float32):
  "input_ids"    int64 [2, 12], drawn from the seed (longer than the windows of 4);
  "logits"       float32 [2, 12, 64], in eval mode;
  "loss"         float32 [], the model's loss with labels = input_ids (mean over the 22
                 shifted targets), in eval mode;
  "train_losses" float32 [20], the loss before each of 20 steps of torch.optim.AdamW(lr=1e-2,
                 defaults otherwise) on that one batch (train mode; attention_dropout is 0).
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

SEED = 4321
TESTDATA = "checkpoint/testdata"
MAX_DIR_BYTES = 200 * 1024
SEQ_LEN = 12
TRAIN_STEPS = 20
GENERATE_PROMPT = [3, 17, 42, 8]

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


def write(model, name):
    out_dir = os.path.join(TESTDATA, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir)
    input_ids = torch.randint(0, SIZES["vocab_size"], (2, SEQ_LEN), dtype=torch.int64)

    model = type(model).from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        out = model(input_ids=input_ids, labels=input_ids)
    logits = out.logits.to(torch.float32).contiguous()
    loss = out.loss.to(torch.float32).reshape([])

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_losses = []
    for _ in range(TRAIN_STEPS):
        optimizer.zero_grad()
        step_loss = model(input_ids=input_ids, labels=input_ids).loss
        step_loss.backward()
        optimizer.step()
        train_losses.append(step_loss.item())

    save_file(
        {"input_ids": input_ids, "logits": logits, "loss": loss,
         "train_losses": torch.tensor(train_losses, dtype=torch.float32)},
        os.path.join(out_dir, "expected_logits.safetensors"),
        metadata={"format": "pt"},
    )
    total = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{out_dir}: {sorted(os.listdir(out_dir))}, {total} bytes, loss {loss.item():.6f}, "
          f"train {train_losses[0]:.4f} -> {train_losses[-1]:.4f}")
    if total > MAX_DIR_BYTES:
        sys.exit(f"{out_dir} is {total} bytes, over {MAX_DIR_BYTES}: make the model smaller")


def write_eval_golden(names):
    """eval.bin and transformers' eval loss of every directory on it."""
    out_dir = "tools/testdata/hf_arch_eval"
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(SEED + 20)
    samples, seq_len = 8, 24
    tokens = torch.randint(0, SIZES["vocab_size"], (samples * seq_len,), dtype=torch.int64)
    tokens.to(torch.int16).numpy().astype("<u2").tofile(os.path.join(out_dir, "eval.bin"))
    ids = tokens.reshape(samples, seq_len)
    losses, completions = {}, {}
    prompt = torch.tensor([GENERATE_PROMPT], dtype=torch.int64)
    for name in names:
        model = AutoModelForCausalLM.from_pretrained(os.path.join(TESTDATA, name),
                                                     dtype=torch.float32,
                                                     attn_implementation="eager")
        model.eval()
        with torch.no_grad():
            losses[name] = model(input_ids=ids, labels=ids).loss.item()
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=20)
        completions[name] = " ".join(str(t) for t in out[0, prompt.size(1):].tolist())
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump({"eval_file": "eval.bin", "seq_len": seq_len, "eval_loss": losses,
                   "prompt": " ".join(str(t) for t in GENERATE_PROMPT),
                   "completion": completions}, f, indent=2)
        f.write("\n")
    print(f"{out_dir}: {losses}, {completions}")


# Rotary embeddings at real sizes, each a config.json (save_pretrained's, or a transformers 4.x
# file as on the Hub) and transformers' rope init function on it.
QWEN25_YARN_4X = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
    "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 131072,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
    "use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 2,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}


# Phi-3-mini-128k's form (4.x): "su" scaling, the pretraining length at the top level.
PHI3_SU_4X = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 32064,
    "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 2,
    "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
    "sliding_window": 262144, "tie_word_embeddings": False, "resid_pdrop": 0.0,
    "embd_pdrop": 0.0, "attention_dropout": 0.0,
    "rope_scaling": {"type": "su", "short_factor": [1.0 + 0.02 * i for i in range(48)],
                     "long_factor": [1.0 + 1.3 * i for i in range(48)]},
}


def rope_init_cases():
    """(name, config, config.json dict or None for save_pretrained's, [seq_len, ...])."""
    sizes = dict(vocab_size=64, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)  # head_dim 64
    cases = [("qwen25_yarn_4x", Qwen2Config.from_dict(dict(QWEN25_YARN_4X)), QWEN25_YARN_4X,
              [None])]
    cases.append(("llama_yarn_mscale", LlamaConfig(
        **sizes, max_position_embeddings=65536,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 16.0,
                         "beta_slow": 2.0, "mscale": 0.707, "mscale_all_dim": 1.0,
                         "truncate": False}), None, [None]))
    cases.append(("llama_yarn_attention_factor", LlamaConfig(
        **sizes, max_position_embeddings=8192,
        rope_parameters={"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                         "attention_factor": 0.8, "original_max_position_embeddings": 2048}),
        None, [None]))
    short = [1.0 + 0.05 * i for i in range(32)]
    long = [1.0 + 0.7 * i for i in range(32)]
    cases.append(("llama_longrope", LlamaConfig(
        **sizes, max_position_embeddings=131072,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short,
                         "long_factor": long, "original_max_position_embeddings": 4096}),
        None, [None, 4096, 4097]))
    cases.append(("llama_longrope_factor", LlamaConfig(
        **sizes, max_position_embeddings=16384,
        rope_parameters={"rope_type": "longrope", "rope_theta": 250000.0, "short_factor": short,
                         "long_factor": long, "factor": 2.5, "attention_factor": 1.25,
                         "original_max_position_embeddings": 4096}), None, [5000]))
    cases.append(("phi3_su_4x", Phi3Config.from_dict(dict(PHI3_SU_4X)), PHI3_SU_4X,
                  [None, 4097]))
    return cases


def write_rope_init_golden(cases):
    """checkpoint/testdata/hf_rope_init/: NAME.json and golden.safetensors, holding for each case
    NAME.inv_freq.SEQ (fp32, SEQ "init" for the function called without seq_len, as the rotary
    embedding's constructor does, else the forward's length) and NAME.attention_scaling (fp64)."""
    out_dir = os.path.join(TESTDATA, "hf_rope_init")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    tensors = {}
    for name, config, json_dict, seq_lens in cases:
        if json_dict is None:
            config.save_pretrained(os.path.join(out_dir, name))
            os.replace(os.path.join(out_dir, name, "config.json"),
                       os.path.join(out_dir, f"{name}.json"))
            os.rmdir(os.path.join(out_dir, name))
        else:
            with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
                json.dump(json_dict, f, indent=2)
        rope_type = config.rope_parameters["rope_type"]
        for seq_len in seq_lens:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
            tensors[f"{name}.inv_freq.{seq_len or 'init'}"] = inv_freq.to(torch.float32)
        tensors[f"{name}.attention_scaling"] = torch.tensor(scaling, dtype=torch.float64)
        print(f"{name}: {rope_type}, attention_scaling {scaling}")
    save_file(tensors, os.path.join(out_dir, "golden.safetensors"), metadata={"format": "pt"})


def build(cls, config_cls, seed, **kwargs):
    torch.manual_seed(seed)
    model = cls(config_cls(**SIZES, attn_implementation="eager", **kwargs))
    randomize(model)
    return model


def main():
    if not os.path.isdir(TESTDATA):
        sys.exit(f"run from the repository root ({TESTDATA} not found)")
    qwen2 = dict(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                 rms_norm_eps=1e-6)
    write(build(Qwen2ForCausalLM, Qwen2Config, SEED, tie_word_embeddings=False, **qwen2),
          "hf_qwen2_tiny")
    tied = build(Qwen2ForCausalLM, Qwen2Config, SEED + 1, tie_word_embeddings=True, **qwen2)
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    write(tied, "hf_qwen2_tied_tiny")
    sliding = build(Qwen2ForCausalLM, Qwen2Config, SEED + 2, tie_word_embeddings=False,
                    use_sliding_window=True, sliding_window=4, max_window_layers=1, **qwen2)
    assert sliding.config.layer_types == ["full_attention", "sliding_attention"], \
        sliding.config.layer_types
    write(sliding, "hf_qwen2_sliding_tiny")
    write(build(LlamaForCausalLM, LlamaConfig, SEED + 3, tie_word_embeddings=False,
                mlp_bias=True, rms_norm_eps=1e-5), "hf_llama_mlp_bias_tiny")
    write(build(MistralForCausalLM, MistralConfig, SEED + 4, tie_word_embeddings=False,
                sliding_window=4, rms_norm_eps=1e-5), "hf_mistral_tiny")
    qwen3 = build(Qwen3ForCausalLM, Qwen3Config, SEED + 5, head_dim=8, tie_word_embeddings=True,
                  use_sliding_window=True, sliding_window=5, max_window_layers=1, **qwen2)
    assert qwen3.config.layer_types == ["full_attention", "sliding_attention"], \
        qwen3.config.layer_types
    write(qwen3, "hf_qwen3_sliding_tiny")
    # Qwen2.5's long-context yarn in rope_scaling (4.x form), over a short pretraining length
    # so that the 12 positions span the ramp.
    yarn = build(Qwen2ForCausalLM, Qwen2Config, SEED + 6, tie_word_embeddings=False,
                 max_position_embeddings=64, rms_norm_eps=1e-6,
                 rope_scaling={"type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                               "original_max_position_embeddings": 16})
    write(yarn, "hf_rope_yarn_tiny")
    short = [1.0, 1.5, 2.0, 3.0]
    long = [1.0, 4.0, 9.0, 20.0]
    longrope = build(LlamaForCausalLM, LlamaConfig, SEED + 7, tie_word_embeddings=False,
                     max_position_embeddings=64, rms_norm_eps=1e-5,
                     rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                      "short_factor": short, "long_factor": long,
                                      "original_max_position_embeddings": 8})
    write(longrope, "hf_rope_longrope_tiny")  # 12 tokens > 8: the long factors
    # Phi-3: fused qkv_proj and gate_up_proj, longrope with the pretraining length (8) below
    # the 12 tokens, a window of 6 in every layer.
    phi3 = build(Phi3ForCausalLM, Phi3Config, SEED + 8, tie_word_embeddings=False,
                 max_position_embeddings=64, original_max_position_embeddings=8, sliding_window=6,
                 rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=1, eos_token_id=2,
                 rope_scaling={"type": "longrope", "rope_theta": 10000.0,
                               "short_factor": short, "long_factor": long})
    assert phi3.config.rope_parameters["original_max_position_embeddings"] == 8
    write(phi3, "hf_phi3_tiny")
    # Phi-3 with partial_rotary_factor 0.5 (Phi-4-mini's form): the first 4 of 8 dimensions
    # turn (longrope with 2 factors each), the other 4 pass through.
    phi3_partial = build(Phi3ForCausalLM, Phi3Config, SEED + 11, tie_word_embeddings=False,
                         max_position_embeddings=64, original_max_position_embeddings=8,
                         partial_rotary_factor=0.5, rms_norm_eps=1e-5, pad_token_id=None,
                         bos_token_id=1, eos_token_id=2,
                         rope_scaling={"type": "longrope", "rope_theta": 10000.0,
                                       "short_factor": [1.0, 2.0], "long_factor": [1.0, 5.0]})
    assert phi3_partial.config.rope_parameters["partial_rotary_factor"] == 0.5
    write(phi3_partial, "hf_phi3_partial_tiny")
    # Gemma 2: (1 + w) norms (w drawn around 1 as every norm here, so 1 + w is around 2), the
    # sqrt(hidden) embedding scale, GeGLU, sandwich norms, query_pre_attn_scalar 16
    # (not head_dim 8), attention and final logit soft-capping small enough to bind, layer 0
    # sliding (window 4), layer 1 global; tied.
    gemma2 = build(Gemma2ForCausalLM, Gemma2Config, SEED + 9, head_dim=8, query_pre_attn_scalar=16,
                   attn_logit_softcapping=2.0, final_logit_softcapping=3.0, sliding_window=4,
                   pad_token_id=None, rms_norm_eps=1e-6)
    assert gemma2.config.layer_types == ["sliding_attention", "full_attention"]
    write(gemma2, "hf_gemma2_tiny")
    # Gemma 3 (text): QK-norm, no soft-capping, local rope base 10000 for the sliding layer and
    # linear scaling (factor 2) over base 1e6 for the global one.
    gemma3 = build(Gemma3ForCausalLM, Gemma3TextConfig, SEED + 10, head_dim=8,
                   query_pre_attn_scalar=16, sliding_window=4, pad_token_id=None,
                   layer_types=["sliding_attention", "full_attention"],
                   rope_parameters={
                       "full_attention": {"rope_type": "linear", "factor": 2.0,
                                          "rope_theta": 1000000.0},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    write(gemma3, "hf_gemma3_tiny")
    write_rope_init_golden(rope_init_cases())
    write_eval_golden(["hf_qwen2_tiny", "hf_qwen2_tied_tiny", "hf_qwen2_sliding_tiny",
                       "hf_qwen3_sliding_tiny", "hf_llama_mlp_bias_tiny", "hf_mistral_tiny", "hf_rope_yarn_tiny",
                       "hf_phi3_tiny", "hf_phi3_partial_tiny", "hf_gemma2_tiny", "hf_gemma3_tiny"])


if __name__ == "__main__":
    main()
