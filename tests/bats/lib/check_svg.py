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
