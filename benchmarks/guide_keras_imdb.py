"""The guide's own TensorFlow/Keras IMDB code, timed as a whole script: the reference for `imdb/text_classifier`.

The guide's code runs in a Python that has TensorFlow (not a dependency of this project), given by
`--python`; this script itself runs in the project's environment, which writes the result file:

    python3 -m venv /tmp/tf && /tmp/tf/bin/pip install tensorflow-cpu
    python benchmarks/guide_keras_imdb.py --python /tmp/tf/bin/python --data ../shared/data/imdb/aclImdb_labeled.tar.gz

The archive is extracted to a temporary folder first, untimed (the guide's `get_file(untar=True)`
downloads and extracts it; here there is no network). Then the guide's code, from its imports to
`model.evaluate(test_ds)`, runs in a fresh process and is timed whole, start-up included, as
`benchmarks/case_studies.py` times `inceptionlab train`. Prints one JSON line per seed and writes
mean +- std over the seeds as a result file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _results import write_result  # this folder's sibling modules
from case_studies import describe

# The guide's code (case_studies.html, "TensorFlow with Text Classification"), its prints and
# plots left out; the standardisation replaces "<br />" as TensorFlow's tutorial does.
GUIDE = r'''
import os, re, string, sys
import tensorflow as tf
from tensorflow.keras import layers, losses

tf.keras.utils.set_random_seed(int(sys.argv[2]))
os.chdir(sys.argv[1])
batch_size = 32
seed = 42
raw_train_ds = tf.keras.utils.text_dataset_from_directory(
    "aclImdb/train", batch_size=batch_size, validation_split=0.2, subset="training", seed=seed)
raw_val_ds = tf.keras.utils.text_dataset_from_directory(
    "aclImdb/train", batch_size=batch_size, validation_split=0.2, subset="validation", seed=seed)
raw_test_ds = tf.keras.utils.text_dataset_from_directory("aclImdb/test", batch_size=batch_size)


def custom_standardization(input_data):
    lowercase = tf.strings.lower(input_data)
    stripped_html = tf.strings.regex_replace(lowercase, "<br />", " ")
    return tf.strings.regex_replace(stripped_html, "[%s]" % re.escape(string.punctuation), "")


max_features = 10000
sequence_length = 250
vectorize_layer = layers.TextVectorization(
    standardize=custom_standardization, max_tokens=max_features, output_mode="int",
    output_sequence_length=sequence_length)
train_text = raw_train_ds.map(lambda x, y: x)
vectorize_layer.adapt(train_text)


def vectorize_text(text, label):
    text = tf.expand_dims(text, -1)
    return vectorize_layer(text), label


train_ds = raw_train_ds.map(vectorize_text)
val_ds = raw_val_ds.map(vectorize_text)
test_ds = raw_test_ds.map(vectorize_text)
AUTOTUNE = tf.data.AUTOTUNE
train_ds = train_ds.cache().prefetch(buffer_size=AUTOTUNE)
val_ds = val_ds.cache().prefetch(buffer_size=AUTOTUNE)
test_ds = test_ds.cache().prefetch(buffer_size=AUTOTUNE)
embedding_dim = 16
model = tf.keras.Sequential([layers.Embedding(max_features + 1, embedding_dim), layers.Dropout(0.2),
                             layers.GlobalAveragePooling1D(), layers.Dropout(0.2), layers.Dense(1)])
model.compile(loss=losses.BinaryCrossentropy(from_logits=True), optimizer="adam",
              metrics=[tf.metrics.BinaryAccuracy(threshold=0.0)])
model.fit(train_ds, validation_data=val_ds, epochs=10, verbose=0)
loss, accuracy = model.evaluate(test_ds, verbose=0)
print("TENSORFLOW", tf.__version__)
print("ACCURACY", accuracy)
'''


def extract(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        members = [m for m in tar if "/unsup/" not in m.name]  # the guide deletes train/unsup
        tar.extractall(into, members=members, filter="data")
    roots = [p.parent for p in into.rglob("train") if (p / "pos").is_dir()]
    if not roots:
        raise SystemExit(f"{archive} holds no aclImdb/train/pos folder")
    return roots[0].parent


def run_guide(python: str, folder: Path, seed: int) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([python, "-c", GUIDE, str(folder), str(seed)], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"the guide's code failed:\n{proc.stderr[-2000:]}")
    accuracy = float(proc.stdout.split("ACCURACY")[-1])
    tensorflow = proc.stdout.split("TENSORFLOW")[-1].split()[0]
    return {"case": "imdb", "code": "guide_keras", "seed": seed, "wall_s": round(wall, 2), "accuracy": accuracy,
            "tensorflow": tensorflow}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="aclImdb .tar.gz (or a folder holding aclImdb/)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--python", default=sys.executable, help="a Python with TensorFlow (default: this one)")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = extract(args.data, Path(tmp)) if args.data.is_file() else args.data
        for seed in range(args.seeds):
            runs.append(run_guide(args.python, folder, seed))
            print(json.dumps(runs[-1]), flush=True)
    row = {"code": "the guide's Keras code", "tensorflow": runs[0]["tensorflow"], "n": len(runs),
           "accuracy": describe([r["accuracy"] for r in runs], 4), "wall_s": describe([r["wall_s"] for r in runs], 1),
           "runs": runs}
    write_result("guide_keras_imdb", [row], settings={k: str(v) for k, v in vars(args).items()},
                 title="The guide's TensorFlow/Keras IMDB code, the whole script",
                 columns=[("code", "code"), ("tensorflow", "TensorFlow"), ("n", "seeds"),
                          ("accuracy", "test accuracy, mean +- std"), ("wall_s", "whole script s, mean +- std")])


if __name__ == "__main__":
    main()
