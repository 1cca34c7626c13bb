#!/usr/bin/env python3
"""examples/inference end to end: a FashionMNIST run on 2 workers, then the
inference program loads the run's best checkpoint (no trainrun run) and
evaluates it. The best checkpoint is the first (scored by epoch, lowest best),
not the latest, and the program's accuracy must be the one that epoch reported.

The test set is cut to its first 1000 images (a data directory of its own), so
that both evaluations take seconds.

usage: test_inference.py TRAINRUN PLUGIN INFERENCE DATA_DIR
"""
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile

TEST_IMAGES = 1000


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read()


def find(data_dir, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    sys.exit(f"{stem} is not in {data_dir} (dataset-fashion-mnist)")


def cut_test_set(data_dir, out_dir):
    """The training files linked, the test files cut to TEST_IMAGES, as idx."""
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        source = find(data_dir, stem)
        os.symlink(source, os.path.join(out_dir, os.path.basename(source)))
    images = read_idx(find(data_dir, "t10k-images-idx3-ubyte"))
    labels = read_idx(find(data_dir, "t10k-labels-idx1-ubyte"))
    count = TEST_IMAGES.to_bytes(4, "big")
    with open(os.path.join(out_dir, "t10k-images-idx3-ubyte"), "wb") as f:
        f.write(images[:4] + count + images[8:16] + images[16:16 + TEST_IMAGES * 28 * 28])
    with open(os.path.join(out_dir, "t10k-labels-idx1-ubyte"), "wb") as f:
        f.write(labels[:4] + count + labels[8:8 + TEST_IMAGES])


def main():
    trainrun, plugin, inference, data_dir = sys.argv[1:5]
    with tempfile.TemporaryDirectory(prefix="trainrun-inference-") as tmp:
        data = os.path.join(tmp, "data")
        os.mkdir(data)
        cut_test_set(data_dir, data)
        storage = os.path.join(tmp, "results")
        run = subprocess.run(
            [trainrun, "--plugin", plugin, "-n", "2", "--storage-path", storage, "--name", "fm",
             "--config", "epochs=2", "--config", "max_steps=8", "--config", "batch_size=32",
             "--config", "warmup_steps=0", "--config", f"data_dir={data}",
             "--checkpoint-score-attribute", "epoch", "--checkpoint-score-order", "min",
             "--quiet"],
            capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"the run failed ({run.returncode}):\n{run.stderr}"
        run_dir = os.path.join(storage, "fm")
        with open(os.path.join(run_dir, "result.jsonl")) as f:
            reports = [json.loads(line) for line in f if '"metrics"' in line]
        assert [r["metrics"]["epoch"] for r in reports] == [0, 1], reports
        first = reports[0]
        assert first["checkpoint"], first

        # The program, run as a user would: no trainrun process anywhere.
        out = subprocess.run([inference, run_dir, data], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, f"inference failed ({out.returncode}):\n{out.stderr}"
        print(out.stdout, end="")
        assert f"{run_dir}/{first['checkpoint']} (iteration {first['iteration']}" in out.stdout, \
            "not the best checkpoint (epoch 0's)"
        match = re.search(r"test accuracy: ([0-9.]+) \((\d+) of (\d+) images\)", out.stdout)
        assert match, out.stdout
        accuracy, total = float(match.group(1)), int(match.group(3))
        assert total == TEST_IMAGES, total
        reported = first["metrics"]["accuracy"]
        # The same weights on the same images: the same answers, but for an
        # image whose top two scores round differently in batches of other sizes.
        assert abs(accuracy - reported) <= 2 / TEST_IMAGES, (accuracy, reported)
        assert accuracy > 0.15, f"{accuracy}: no better than chance (0.1); not the trained model"
        assert len(re.findall(r"^image \d: predicted ", out.stdout, re.M)) == 5, out.stdout

        # A directory that holds no run is one clear line, exit 2.
        bad = subprocess.run([inference, tmp], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2, (bad.returncode, bad.stderr)
        assert bad.stderr.startswith("inference: ") and bad.stderr.count("\n") == 1, bad.stderr
    print("inference: the best checkpoint loaded and evaluated as reported")


if __name__ == "__main__":
    main()
