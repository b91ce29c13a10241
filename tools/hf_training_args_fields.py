#!/usr/bin/env python3
"""Prints the field names of the installed transformers.TrainingArguments, one a line, in
declaration order, after a comment naming the transformers version. Its output is committed as
config/testdata/hf_training_arguments_fields.txt, which config/hf_training_args_test checks
against the table in config/hf_training_args.cc (every name accepted, mapped or refused), and
which config/hf_training_args_fields_test.sh regenerates from transformers as PyPI has it.
TrainingArguments imports without torch.

    python3 tools/hf_training_args_fields.py > config/testdata/hf_training_arguments_fields.txt
"""
import dataclasses
import logging
import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
logging.disable(logging.WARNING)

import transformers  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

print(f"# transformers {transformers.__version__} TrainingArguments fields "
      "(tools/hf_training_args_fields.py)")
for field in dataclasses.fields(TrainingArguments):
    if field.init:
        print(field.name)
