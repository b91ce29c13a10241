#!/usr/bin/env python3
"""Writes the instruction-tuning parity fixture for //tools:sft_parity_test: a word-level
tokenizer with a chat template carrying {% generation %} markers, a tiny random Qwen3 saved
with save_pretrained, two small text datasets (prompt/completion and messages), their
pre-tokenized forms made by tools/sft_tokenize.py, and the per-step training losses of TRL's
SFTTrainer on them (packing "bfd", padding_free, completion_only_loss / assistant_only_loss,
AdamW, gradient accumulation 2), which tools/train must reproduce.

Run from the repository root (needs torch, transformers 5.x, tokenizers, trl, datasets):
  python3 tests/golden/gen_sft_golden.py
Writes tools/testdata/sft/: model/ (config, weights, tokenizer), pc.jsonl, pc.tok.jsonl,
chat.jsonl, chat.tok.jsonl, golden.json (and golden.txt, its losses as text).

It also checks, on the first padding-free micro-batch TRL collates, that transformers confines
attention to each packed example (the loss of the packed row equals the sum of each example's
loss computed alone) and that the same row without position_ids gives another loss; both
figures go into golden.json ("attention_check").
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import torch

OUT = "tools/testdata/sft"
SEED = 4321
WORDS = [f"w{i}" for i in range(52)]
SPECIAL = ["<pad>", "<eos>", "<|im_start|>", "<|im_end|>"]
ROLES = ["user", "assistant", "system"]
MAX_LENGTH = 32
ROWS_PER_STEP = 4  # per_device_train_batch_size 2 x gradient_accumulation_steps 2
TRAIN = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=2e-3,
             lr_scheduler_type="linear", warmup_steps=2, max_steps=20, weight_decay=0.01,
             seed=42, max_length=MAX_LENGTH)
# Assistant turns (content and end-of-turn token) inside {% generation %}, so
# return_assistant_tokens_mask marks them.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant ' }}{% generation %}{{ message['content'] + ' <|im_end|>' }}"
    "{% endgeneration %}{{ ' ' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + ' ' + message['content'] + ' <|im_end|> ' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant ' }}{%- endif -%}"
)


def write_tokenizer(model_dir):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL + ROLES + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(model_dir)
    return len(vocab)


def write_model(model_dir, vocab_size):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, tie_word_embeddings=True, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         max_position_embeddings=128, bos_token_id=None, eos_token_id=1,
                         pad_token_id=0)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.save_pretrained(model_dir)


def sentence(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def prompt_completion_records(rng, n):
    records = [{"prompt": sentence(rng, 2, 10), "completion": " " + sentence(rng, 1, 7)}
               for _ in range(n)]
    # Longer than max_length: bfd truncates it (its completion is cut away entirely).
    records[3] = {"prompt": sentence(rng, MAX_LENGTH + 4, MAX_LENGTH + 4),
                  "completion": " " + sentence(rng, 2, 3)}
    return records


def chat_records(rng, n):
    records = []
    for i in range(n):
        messages = [{"role": "system", "content": sentence(rng, 1, 3)}] if i % 3 == 0 else []
        for _ in range(rng.randint(1, 2)):
            messages.append({"role": "user", "content": sentence(rng, 1, 5)})
            messages.append({"role": "assistant", "content": sentence(rng, 1, 4)})
        records.append({"messages": messages})
    return records


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def tokenize(model_dir, name, assistant_only_loss):
    cmd = [sys.executable, "tools/sft_tokenize.py", "--model", model_dir,
           "--input", f"{OUT}/{name}.jsonl", "--output", f"{OUT}/{name}.tok.jsonl"]
    if assistant_only_loss:
        cmd.append("--assistant_only_loss")
    subprocess.run(cmd, check=True)


def packed_rows(name):
    from datasets import Dataset
    from trl import pack_dataset

    with open(f"{OUT}/{name}.tok.jsonl") as f:
        ids = [json.loads(line)["input_ids"] for line in f]
    return len(pack_dataset(Dataset.from_dict({"input_ids": ids}), MAX_LENGTH, "bfd"))


def records_with_whole_steps(model_dir, name, make, assistant_only_loss):
    """Adds records until the packed rows fill whole optimizer steps."""
    rng = random.Random(SEED + len(name))
    n = 40
    while True:
        write_jsonl(f"{OUT}/{name}.jsonl", make(rng, n))
        tokenize(model_dir, name, assistant_only_loss)
        rows = packed_rows(name)
        if rows % ROWS_PER_STEP == 0:
            return rows
        n += 1
        rng = random.Random(SEED + len(name))


def attention_check(model, batch):
    """Loss of the packed row with and without position_ids, and the sum over its examples."""
    ids, labels, pos = batch["input_ids"], batch["labels"], batch["position_ids"]
    starts = (pos[0] == 0).nonzero().flatten().tolist() + [ids.size(1)]
    with torch.no_grad():
        def loss_sum(i, l, p=None):
            # use_cache=False: with a cache transformers skips the packed-sequence mask.
            logits = model(input_ids=i, position_ids=p, use_cache=False).logits[:, :-1].float()
            return torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), l[:, 1:].reshape(-1), ignore_index=-100,
                reduction="sum").item()
        packed = loss_sum(ids, labels, pos)
        alone = sum(loss_sum(ids[:, a:b], labels[:, a:b]) for a, b in zip(starts, starts[1:]))
        unconfined = loss_sum(ids, labels)
    return {"examples": len(starts) - 1, "packed_loss_sum": packed,
            "examples_alone_loss_sum": alone, "without_position_ids_loss_sum": unconfined,
            "max_abs_diff_confined": abs(packed - alone),
            "diff_without_position_ids": abs(unconfined - alone)}


def train_trl(model_dir, name, assistant_only_loss):
    from datasets import Dataset
    from transformers import AutoTokenizer, Qwen3ForCausalLM
    from trl import SFTConfig, SFTTrainer

    with open(f"{OUT}/{name}.jsonl") as f:
        dataset = Dataset.from_list([json.loads(line) for line in f])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="eager")
    with tempfile.TemporaryDirectory() as tmp:
        config = SFTConfig(output_dir=tmp, packing=True, packing_strategy="bfd",
                           padding_free=True, assistant_only_loss=assistant_only_loss,
                           logging_steps=1, report_to="none", save_strategy="no",
                           use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                           # SFTConfig turns bf16 autocast on by default (also on the CPU): fp32.
                           bf16=False, **TRAIN)
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset,
                             processing_class=tokenizer)
        first = next(iter(trainer.get_train_dataloader()))
        check = attention_check(model, first)
        rows = len(trainer.train_dataset)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == TRAIN["max_steps"], losses
    return {"losses": losses, "packed_rows": rows, "attention_check": check,
            "completion_only_loss": trainer.completion_only_loss,
            "assistant_only_loss": assistant_only_loss}


def main():
    if not os.path.isdir("tools/testdata"):
        sys.exit("run from the repository root")
    import transformers
    import trl

    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    model_dir = f"{OUT}/model"
    vocab_size = write_tokenizer(model_dir)
    write_model(model_dir, vocab_size)
    golden = {"generator": "tests/golden/gen_sft_golden.py",
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "trl": trl.__version__},
              "train": TRAIN, "runs": {}}
    for name, make, assistant in (("pc", prompt_completion_records, False),
                                  ("chat", chat_records, True)):
        rows = records_with_whole_steps(model_dir, name, make, assistant)
        result = train_trl(model_dir, name, assistant)
        assert result["packed_rows"] == rows, (result["packed_rows"], rows)
        golden["runs"][name] = result
        print(name, json.dumps(result["attention_check"]), result["losses"][:3], "...")
    with open(f"{OUT}/golden.json", "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    # The same losses for the shell test: "<run> <packed rows> <loss at step 1> ... <step 20>".
    with open(f"{OUT}/golden.txt", "w") as f:
        for name, run in golden["runs"].items():
            f.write(" ".join([name, str(run["packed_rows"])] + [repr(x) for x in run["losses"]]))
            f.write("\n")
    total = sum(os.path.getsize(os.path.join(d, x)) for d, _, xs in os.walk(OUT) for x in xs)
    print(f"{OUT}: {total} bytes")


if __name__ == "__main__":
    main()
