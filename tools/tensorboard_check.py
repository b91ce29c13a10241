"""Reads a run's TensorBoard event files with TensorBoard's own loader and checks them against
the run's metrics.jsonl: every logged value under Hugging Face's tag, at its step; and, as
Hugging Face writes them, the training arguments and the model's configuration as text
(args/text_summary, model_config/text_summary) and train/total_flos.

  python tools/tensorboard_check.py LOGGING_DIR OUTPUT_DIR/metrics.jsonl
"""
import json
import math
import sys

from tensorboard.backend.event_processing import event_accumulator


def tag(key):
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_"):]
    if key.startswith("test_"):
        return "test/" + key[len("test_"):]
    return "train/" + key


def main(logging_dir, metrics_path):
    events = event_accumulator.EventAccumulator(logging_dir,
                                                size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = {t: {e.step: e.value for e in events.Scalars(t)} for t in events.Tags()["scalars"]}
    expected = 0
    for line in open(metrics_path):
        record = json.loads(line)
        step = int(record["step"])
        for key, value in record.items():
            if key == "step" or not isinstance(value, (int, float)):
                continue
            name = tag(key)
            got = scalars.get(name, {}).get(step)
            if got is None or not math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-6):
                sys.exit(f"FAIL: {name} at step {step}: TensorBoard has {got}, metrics.jsonl {value}")
            expected += 1
    for needed in ("train/loss", "train/learning_rate", "train/grad_norm", "eval/loss",
                   "train/total_flos"):
        if needed not in scalars:
            sys.exit(f"FAIL: no {needed} in {sorted(scalars)}")
    texts = {}
    for name in events.Tags()["tensors"]:
        proto = events.Tensors(name)[0].tensor_proto
        texts[name] = proto.string_val[0].decode() if proto.string_val else ""
    for name, key in (("args/text_summary", "learning_rate"),
                      ("model_config/text_summary", "hidden_size")):
        if name not in texts:
            sys.exit(f"FAIL: no text {name} in {sorted(texts)}")
        if f'"{key}"' not in texts[name]:
            sys.exit(f"FAIL: the text {name} has no \"{key}\": {texts[name][:200]}")
        json.loads(texts[name])
    print(f"PASS: {expected} values under {len(scalars)} tags match metrics.jsonl: {sorted(scalars)}; "
          f"texts {sorted(texts)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
