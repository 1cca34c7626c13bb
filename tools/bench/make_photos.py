#!/usr/bin/env python3
"""WebDataset shards of JPEG photographs of ImageNet's size, for tools/bench/ingest.py.

Each image is cut from one of the photographs that Debian's mate-backgrounds
installs (/usr/share/backgrounds/mate/nature/*.jpg, 12 of 1280x1024 to
2560x1920; the package's other pictures are drawings and flat graphics, whose
JPEGs are a few KB and decode faster than a photograph's): a crop of random
position and size, of the output's shape, flipped left to right half the time,
resized with PIL (bicubic) to the shape of most ImageNet training images,
500x375 (70%), 375x500 (15%) or 500x333 (15%), and saved as JPEG quality 90
with 4:2:0 chroma subsampling. The wallpapers were saved smoothed and heavily
compressed, so their crops would make JPEGs of about 28 KB, where ImageNet's
average about 110 KB, and a JPEG's decoding time grows with its size; a grain
of Gaussian noise on the luma (standard deviation --grain, 8 of 255), as a
camera's sensor leaves, brings them to about 69 KB (PIL decodes one in 1.5 ms
on a core, against 1.15 ms without the grain).

Image i draws everything from random.Random(f"{seed}:{i}") (its grain from
numpy's default_rng([seed, i])), so the same command makes the same bytes
whatever --jobs is (with the same Pillow, libjpeg and numpy). Samples are
`{key}.jpg` with `{key}.cls`, the source photograph's index (decimal text),
keys %08d, in ustar tars `OUT_DIR/train-000000.tar`... of --per-shard samples
(the last one holds the rest). 10000 images take about 200 CPU-seconds: under
2 minutes on 2 idle cores.

  /opt/trainrun-ingest/bin/python tools/bench/make_photos.py OUT_DIR [--images 10000]
      [--per-shard 1000] [--seed 0] [--grain 8] [--jobs 2]
      [--sources '/usr/share/backgrounds/mate/nature/*.jpg']

Needs Pillow and numpy (python3-pil, python3-numpy) and the photographs
(apt-get install mate-backgrounds); tools/setup_ingest.sh installs them all.
"""
import argparse
import glob
import io
import multiprocessing
import os
import random
import sys
import tarfile

import numpy as np
from PIL import Image

SOURCES = "/usr/share/backgrounds/mate/nature/*.jpg"
SHAPES = [((500, 375), 0.70), ((375, 500), 0.15), ((500, 333), 0.15)]  # width, height
QUALITY = 90
GRAIN = 8.0  # the grain's standard deviation, of 255
CHUNK = 64  # images a worker makes per task

_photos = []  # this process's decoded sources, loaded once by _load


def _load(paths):
    global _photos
    _photos = [Image.open(path).convert("RGB") for path in paths]
    for photo in _photos:
        photo.load()


def make_image(seed, index, grain):
    """Returns (JPEG bytes, label) of image `index`, from the loaded sources."""
    rng = random.Random(f"{seed}:{index}")
    label = rng.randrange(len(_photos))
    photo = _photos[label]
    (width, height), = rng.choices([s for s, _ in SHAPES], [w for _, w in SHAPES])
    # The largest crop of the output's shape that fits the photograph, scaled by
    # 0.3-1 of its side but never below the output's size (no upscaling).
    fit = min(photo.width / width, photo.height / height)
    scale = rng.uniform(min(1.0, max(0.3, 1 / fit)), 1.0) * fit
    crop_w, crop_h = width * scale, height * scale
    left = rng.uniform(0, photo.width - crop_w)
    top = rng.uniform(0, photo.height - crop_h)
    image = photo.resize((width, height), Image.Resampling.BICUBIC,
                         box=(left, top, left + crop_w, top + crop_h), reducing_gap=3.0)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if grain > 0:
        pixels = np.asarray(image, dtype=np.float32)
        noise = np.random.default_rng([seed, index]).standard_normal((height, width, 1),
                                                                    dtype=np.float32)
        pixels += noise * grain + 0.5
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=QUALITY, subsampling=2)  # 2: 4:2:0
    return out.getvalue(), label


def make_chunk(task):
    seed, grain, first, count = task
    return [make_image(seed, i, grain) for i in range(first, first + count)]


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def write_shards(out_dir, images, per_shard, seed, grain=GRAIN, jobs=1, sources=SOURCES):
    """Writes the shards; returns their paths."""
    paths = sorted(glob.glob(sources))
    if not paths:
        sys.exit(f"make_photos: no photographs match {sources} "
                 "(apt-get install mate-backgrounds, or tools/setup_ingest.sh)")
    os.makedirs(out_dir, exist_ok=True)
    tasks = [(seed, grain, first, min(CHUNK, images - first)) for first in range(0, images, CHUNK)]
    if jobs > 1:
        pool = multiprocessing.get_context("fork").Pool(jobs, _load, (paths,))
        chunks = pool.imap(make_chunk, tasks)
    else:
        pool = None
        _load(paths)
        chunks = map(make_chunk, tasks)
    shards = []
    tar = None
    index = 0
    try:
        for chunk in chunks:
            for jpeg, label in chunk:
                if index % per_shard == 0:
                    if tar is not None:
                        tar.close()
                    shards.append(os.path.join(out_dir, f"train-{index // per_shard:06d}.tar"))
                    tar = tarfile.open(shards[-1], "w", format=tarfile.USTAR_FORMAT)
                key = f"{index:08d}"
                add(tar, key + ".jpg", jpeg)
                add(tar, key + ".cls", str(label).encode())
                index += 1
    finally:
        if tar is not None:
            tar.close()
        if pool is not None:
            pool.close()
            pool.join()
    return shards


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grain", type=float, default=GRAIN,
                        help="the grain's standard deviation (of 255); 0 for none")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--sources", default=SOURCES, help="a glob of photographs, used sorted")
    args = parser.parse_args()
    if args.images < 1 or args.per_shard < 1:
        sys.exit("make_photos: --images and --per-shard must be at least 1")
    shards = write_shards(args.out_dir, args.images, args.per_shard, args.seed, args.grain,
                          args.jobs, args.sources)
    size = sum(os.path.getsize(path) for path in shards)
    print(f"make_photos: {args.images} images in {len(shards)} shards of {args.out_dir}, "
          f"{size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
