#!/usr/bin/env python3
"""report.html as a person sees it: rendered by headless Chromium.

    tests/report/test_report_page.py BUILD_DIR

Runs a real training (the test plugin's `epochs` entry, 2 workers, the best
checkpoint by accuracy), renders the run's report.html in headless Chromium
(Debian's `chromium`), and checks that the DOM after the page's scripts ran
holds the right numbers and three charts, and that the screenshot is not
blank: the charts' line colors are drawn. With report.html#time the charts
must span the recorded times, and be drawn too. The screenshots are kept in
BUILD_DIR/artifacts/.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib


def run(cmd, **kwargs):
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=120, **kwargs)
    if result.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {result.returncode}\n"
                         f"{result.stdout[-4000:]}")
    return result.stdout


def read_png(path):
    """(width, height, rows of RGB tuples) of an 8-bit, non-interlaced PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"FAIL: {path} is not a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or color not in (2, 6) or interlace:
                raise SystemExit(f"FAIL: unexpected PNG format {depth}/{color}/{interlace}")
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = previous[i]
            c = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xFF
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, channels)])
        previous = line
    return width, height, rows


def near(pixel, color, tolerance=40):
    return all(abs(p - c) <= tolerance for p, c in zip(pixel, color))


def chromium(args, profile):
    return run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                f"--user-data-dir={profile}", "--hide-scrollbars"] + args)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build = os.path.abspath(sys.argv[1])
    if shutil.which("chromium") is None:
        sys.exit("FAIL: chromium is not installed (tools/setup.sh --tests installs it)")
    artifacts = os.path.join(build, "artifacts")
    os.makedirs(artifacts, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="trainrun-report-")
    try:
        env = dict(os.environ, TRAINRUN_CACHE_DIR=os.path.join(tmp, "cache"), HOME=tmp)
        run([os.path.join(build, "trainrun"), "--plugin",
             os.path.join(build, "tests", "plugins", "libtest_plugin.so"), "--entry", "epochs",
             "-n", "2", "--name", "page", "--storage-path", os.path.join(tmp, "results"),
             "--config", "epochs=4", "--checkpoint-score-attribute", "accuracy",
             "--num-to-keep", "2"], env=env)
        page = os.path.join(tmp, "results", "page", "report.html")
        profile = os.path.join(tmp, "chromium")

        dom = chromium(["--dump-dom", "file://" + page], profile)
        checks = [
            ('<body data-charts="3" data-axis="iteration">',
             "three charts drawn (accuracy, epoch, loss) against iteration"),
            ('<canvas id="chart-0" data-x="1..4"', "the accuracy chart over iterations 1 to 4"),
            ('<th>accuracy</th><td class="num">0.8</td>', "the latest accuracy"),
            ('<th>loss</th><td class="num">0.25</td>', "the latest loss"),
            ('<tr class="best"><td>checkpoint_000003</td><td class="num">4</td>',
             "the best checkpoint marked"),
            ('&lt;b&gt;epoch&lt;/b&gt;', "a text metric shown as text"),
            ('class="status finished"', "the run's status"),
        ]
        for needle, what in checks:
            if needle not in dom:
                raise SystemExit(f"FAIL: the rendered page lacks {what}: {needle}\n{dom[:3000]}")
        if "checkpoint_000001" in dom.split('id="checkpoints"')[1].split("</table>")[0]:
            raise SystemExit("FAIL: a checkpoint that was not kept is listed")

        # report.html#time: the same charts against the recorded time_total_s.
        with open(os.path.join(tmp, "results", "page", "result.jsonl")) as f:
            times = [json.loads(line)["time_total_s"] for line in f]
        dom_time = chromium(["--dump-dom", "file://" + page + "#time"], profile)
        extent = re.search(r'<canvas id="chart-0" data-x="([^"]*)"', dom_time)
        if 'data-axis="time"' not in dom_time or extent is None:
            raise SystemExit(f"FAIL: #time drew no time axis\n{dom_time[:2000]}")
        first, last = (float(v) for v in extent.group(1).split(".."))
        if abs(first - times[0]) > 1e-9 or abs(last - times[-1]) > 1e-9:
            raise SystemExit(f"FAIL: the time axis spans {extent.group(1)}, the run {times}")

        shots = {}
        for name, url in (("report.png", "file://" + page),
                          ("report-time.png", "file://" + page + "#time")):
            shot = os.path.join(artifacts, name)
            if os.path.exists(shot):
                os.remove(shot)
            chromium(["--window-size=1280,1400", f"--screenshot={shot}", url], profile)
            shots[name] = shot
        width, height, rows = read_png(shots["report.png"])
        if (width, height) != (1280, 1400):
            raise SystemExit(f"FAIL: the screenshot is {width}x{height}")
        pixels = [p for row in rows for p in row]
        white = sum(1 for p in pixels if p[0] > 245 and p[1] > 245 and p[2] > 245)
        if white > 0.98 * len(pixels):
            raise SystemExit(f"FAIL: the screenshot is blank ({white} of {len(pixels)} white)")
        # Each chart's line in its color; the best checkpoint's star in gold
        # (a color only the charts use).
        drawn = []
        for name, color in (("accuracy", (0x1f, 0x77, 0xb4)), ("epoch", (0xd6, 0x27, 0x28)),
                            ("loss", (0x2c, 0xa0, 0x2c)), ("best star", (0xb8, 0x86, 0x0b))):
            at = [y for y, row in enumerate(rows) for p in row if near(p, color)]
            if len(at) < 50:
                raise SystemExit(f"FAIL: the {name} chart's color is drawn in {len(at)} pixels")
            drawn += at
        # The time axis is drawn too.
        _, _, time_rows = read_png(shots["report-time.png"])
        time_line = sum(1 for row in time_rows for p in row if near(p, (0x1f, 0x77, 0xb4)))
        if time_line < 50:
            raise SystemExit(f"FAIL: the time axis's accuracy line is drawn in {time_line} pixels")
        print(f"report.html renders: 3 charts, {len(pixels) - white} drawn pixels; "
              f"screenshots in {artifacts}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
