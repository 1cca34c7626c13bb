"""Python's webdataset on trainrun's shards, and trainrun on its.

  wds_tool.py read SPEC        one JSON line per sample, in order: its key and
                               each field's bytes in hex (raw, no decoding)
  wds_tool.py write PATTERN N  writes N samples with webdataset.ShardWriter, 4
                               per shard, and prints what `read` would
"""
import io
import json
import sys

import numpy as np
import webdataset as wds


def describe(sample):
    fields = {k: v.hex() for k, v in sample.items() if not k.startswith("__")}
    return json.dumps({"key": sample["__key__"], "fields": fields}, sort_keys=True)


def read(spec):
    dataset = wds.WebDataset(spec, shardshuffle=False, empty_check=False)
    for sample in dataset:
        print(describe(sample))


def write(pattern, count):
    with wds.ShardWriter(pattern, maxcount=4, verbose=0) as sink:
        for i in range(count):
            array = io.BytesIO()
            np.save(array, np.arange(i % 5 + 1, dtype=np.float32).reshape(1, -1) * i)
            sample = {
                "__key__": f"dir/sample{i:05d}",
                "cls": str(i % 10).encode(),
                "txt": f"text {i}".encode(),
                "npy": array.getvalue(),
                "seg.png": bytes(range(i % 256)) * 3,
            }
            sink.write(sample)
            print(describe(sample))


if __name__ == "__main__":
    if sys.argv[1] == "read":
        read(sys.argv[2])
    elif sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: wds_tool.py read SPEC | write PATTERN N")
