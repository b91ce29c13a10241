#!/usr/bin/env python3
"""Tokenizes instruction (SFT) data for data { format: JSONL } (docs/INSTRUCTION_DATA.md), the
way TRL's SFTTrainer prepares a dataset before it trains, and writes one pre-tokenized JSON
record a line that cpptrain's C++ reader takes (trainer/data/sft_jsonl_dataset.h).

Input records (one JSON object a line), as TRL names them:
  {"text": "..."}                          -> {"input_ids": [...]}
      the eos token is appended unless the text already ends with it (--no-eos: never);
  {"prompt": "...", "completion": "..."}   -> {"input_ids": [...], "completion_mask": [...]}
      the same eos rule on the completion; completion_mask is 1 from where the tokenized prompt
      and prompt + completion stop agreeing (TRL's common prefix) to the end;
  {"prompt": [msgs], "completion": [msgs]} -> the same, through the chat template (the prompt
      rendered with add_generation_prompt);
  {"messages": [{"role": ..., "content": ...}, ...]} -> {"input_ids": [...]}, and with
      --assistant_only_loss also "assistant_masks" (1 on the tokens the template's
      {% generation %} ... {% endgeneration %} blocks produce: the assistant turns).
A "tools" list and a "chat_template_kwargs" object in a record go to apply_chat_template, as
in TRL. Other keys are dropped.

  python3 tools/sft_tokenize.py --model /models/Qwen3-0.6B --input train.jsonl \\
      --output train.tok.jsonl [--assistant_only_loss] [--chat_template template.jinja]

Needs transformers (AutoTokenizer from the model directory; a fast tokenizer for
--assistant_only_loss). The output is written to a temporary file renamed over --output.
"""
import argparse
import json
import os
import sys
import tempfile


def common_prefix_length(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tokenize_record(tok, record, args, line):
    template_kwargs = {}
    if args.chat_template is not None:
        template_kwargs["chat_template"] = args.chat_template
    tools = record.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools)
    if tools is not None:
        template_kwargs["tools"] = tools
    template_kwargs.update(record.get("chat_template_kwargs", {}))

    def chat(messages, **kwargs):
        return tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                       **template_kwargs, **kwargs)

    eos = tok.eos_token
    if "input_ids" in record:
        raise ValueError("already tokenized (it has input_ids): give it to cpptrain as it is")
    if "prompt" in record and "completion" in record:
        prompt, completion = record["prompt"], record["completion"]
        out = {}
        if isinstance(prompt, list):
            prompt_ids = chat(prompt, add_generation_prompt=True)["input_ids"]
            full = chat(prompt + completion, return_assistant_tokens_mask=args.assistant_only_loss)
            ids = full["input_ids"]
            if args.assistant_only_loss:
                out["assistant_masks"] = list(full["assistant_masks"])
        else:
            if eos is not None and not args.no_eos and not completion.endswith(eos):
                completion = completion + eos
            prompt_ids = tok(text=prompt)["input_ids"]
            ids = tok(text=prompt + completion)["input_ids"]
        prompt_len = common_prefix_length(prompt_ids, ids)
        out = {"input_ids": list(ids),
               "completion_mask": [0] * prompt_len + [1] * (len(ids) - prompt_len), **out}
    elif "messages" in record:
        full = chat(record["messages"], return_assistant_tokens_mask=args.assistant_only_loss)
        out = {"input_ids": list(full["input_ids"])}
        if args.assistant_only_loss:
            out["assistant_masks"] = list(full["assistant_masks"])
    elif "text" in record:
        text = record["text"]
        if eos is not None and not args.no_eos and not text.endswith(eos):
            text = text + eos
        out = {"input_ids": list(tok(text=text)["input_ids"])}
    else:
        raise ValueError(f"no text, prompt/completion or messages (keys: {sorted(record)})")
    if args.assistant_only_loss and "assistant_masks" in out and 1 not in out["assistant_masks"]:
        raise ValueError("no assistant token in assistant_masks: the chat template needs "
                         "{% generation %} ... {% endgeneration %} around the assistant turns")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True,
                        help="directory (or name) AutoTokenizer.from_pretrained loads")
    parser.add_argument("--input", required=True, help="JSONL of text records")
    parser.add_argument("--output", required=True, help="JSONL of token records to write")
    parser.add_argument("--assistant_only_loss", action="store_true",
                        help="write assistant_masks for chat records (TRL's assistant_only_loss)")
    parser.add_argument("--chat_template", default=None,
                        help="a Jinja file to use instead of the tokenizer's chat template")
    parser.add_argument("--no-eos", dest="no_eos", action="store_true",
                        help="do not append the eos token to text and completions")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    if args.chat_template is not None:
        with open(args.chat_template) as f:
            args.chat_template = f.read()
    out_dir = os.path.dirname(os.path.abspath(args.output))
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".sft_tokenize.")
    records = 0
    try:
        with open(args.input) as src, os.fdopen(fd, "w") as dst:
            for line_number, line in enumerate(src, 1):
                if not line.strip():
                    continue
                try:
                    out = tokenize_record(tok, json.loads(line), args, line_number)
                except (ValueError, KeyError, TypeError) as e:
                    sys.exit(f"{args.input}:{line_number}: {e}")
                dst.write(json.dumps(out, separators=(",", ":")) + "\n")
                records += 1
        os.chmod(tmp, 0o644)
        os.replace(tmp, args.output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"{args.output}: {records} records")


if __name__ == "__main__":
    main()
