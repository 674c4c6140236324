# SPDX-License-Identifier: MIT
# check_svg.py SVG INDEX_JSON CKPT_DIR: flexfs-inspect --svg's picture
# against independent facts: it parses as XML; one rank box per rank of
# index.json's target; one file box per *.distcp data file of CKPT_DIR;
# the bands reaching each rank sum to the bytes index.json places on it
# (shapes times element size), and the bands leaving each file to its box.
import glob
import json
import math
import os
import re
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
svg, index, ckpt = sys.argv[1:4]
root = ET.parse(svg).getroot()
idx = json.load(open(index))
tp, pp = idx["target"]["tp"], idx["target"]["pp"]
ranks = {"tp%02d_pp%02d" % (t, p) for t in range(tp) for p in range(pp)}

rank_boxes = [g for g in root.iter(NS + "g") if g.get("class") == "rank"]
names = [g.get("data-rank") for g in rank_boxes]
assert sorted(names) == sorted(ranks), (names, ranks)

data = {os.path.basename(f) for f in glob.glob(os.path.join(ckpt, "*.distcp"))}
file_boxes = [g for g in root.iter(NS + "g") if g.get("class") == "file"]
titles = [g.find(NS + "title").text.split(": ")[0] for g in file_boxes]
assert sorted(titles) == sorted(data), (titles, data)

want = dict.fromkeys(ranks, 0)
for t in idx["tensors"].values():
    esz = int(re.search(r"(\d+)$", t["npy_dtype"]).group(1))
    for rank, pl in t["placement"].items():
        want[rank] += math.prod(pl["shape"]) * esz
got = dict.fromkeys(ranks, 0)
per_file = {}
for b in root.iter(NS + "path"):
    got[b.get("data-rank")] += int(b.get("data-bytes"))
    f = b.get("data-file")
    per_file[f] = per_file.get(f, 0) + int(b.get("data-bytes"))
    m = re.search(r": (\d+) bytes$", b.find(NS + "title").text)
    assert int(m.group(1)) == int(b.get("data-bytes")), b.attrib
assert got == want, (got, want)
for g in rank_boxes:
    assert int(g.get("data-bytes")) == want[g.get("data-rank")], g.attrib
for g in file_boxes:
    assert int(g.get("data-bytes")) == per_file[g.get("data-file")], g.attrib
print("ok: %d ranks, %d files, %d bands, %d bytes" %
      (len(ranks), len(data), sum(1 for _ in root.iter(NS + "path")),
       sum(want.values())))

# The picture's legibility: each tensor group its own hue (n hues at least
# 360/n degrees apart) and every band in its group's legend colour; the
# width used (at least 980 units, more only where the labels need it, the
# bands then at their minimum span of 300; the legend inside it); the
# legend at the top, inside an 800-unit window up to 52 groups; every band at least 12 units thick labelled with its group.
def hsl(c):
    m = re.fullmatch(r"hsl\((\d+),(\d+)%,(\d+)%\)", c)
    assert m, c
    return tuple(int(x) for x in m.groups())


W = float(root.get("width"))
H = float(root.get("height"))
legend = {int(g.get("data-group")): g for g in root.iter(NS + "g")
          if g.get("class") == "group"}
colour = {k: g.find(NS + "rect").get("fill") for k, g in legend.items()}
n = len(colour)
assert len(set(colour.values())) == n, colour
hues = sorted(hsl(c)[0] for c in colour.values())
if n > 1:
    gaps = [(hues[(i + 1) % n] - hues[i]) % 360 for i in range(n)]
    assert len(set(hues)) == n and min(gaps) >= 360 / n - 1, hues
assert W >= 980, W
spans = []
for b in root.iter(NS + "path"):
    assert b.get("fill") == colour[int(b.get("data-group"))], b.attrib
    d = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", b.get("d"))]
    spans.append(d[6] - d[0])
    b.set("thick", d[9] - d[7])
# wider than 980 only where the labels leave the bands their minimum span
assert min(spans) >= 299 and (W <= 981 or min(spans) <= 301), (min(spans), W)
for g in legend.values():
    r = g.find(NS + "rect")
    x, y = float(r.get("x")), float(r.get("y"))
    assert x + 12 <= W and y + 12 <= H, g.attrib
    if n <= 52:
        assert y + 12 <= 800, (y, g.attrib)
labelled = {int(t.get("data-group")) for t in root.iter(NS + "text")
            if t.get("class") == "band-label"}
thick = {int(b.get("data-group")) for b in root.iter(NS + "path")
         if b.get("thick") >= 12}
assert thick <= labelled, (thick, labelled)
print("ok: %d groups, distinct hues; %.0f x %.0f; %d groups' bands labelled"
      % (n, W, H, len(labelled)))
