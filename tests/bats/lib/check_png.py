# SPDX-License-Identifier: MIT
# check_png.py PNG SVG: a headless browser's screenshot (PNG) of
# flexfs-inspect's --svg picture shows, without scrolling, every tensor
# group's legend swatch (a 12x12 square in the group's colour from the SVG)
# and the file and rank boxes (#555).  PNG decoded here (zlib, no imaging
# library): 8-bit RGB or RGBA, not interlaced, as Chromium writes it.
import colorsys
import re
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

NS = "{http://www.w3.org/2000/svg}"
png, svg = sys.argv[1:3]
raw = open(png, "rb").read()
assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
at, idat, hdr = 8, b"", None
while at < len(raw):
    n, kind = struct.unpack(">I4s", raw[at:at + 8])
    body = raw[at + 8:at + 8 + n]
    if kind == b"IHDR":
        hdr = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
        idat += body
    at += 12 + n
w, h, depth, ctype, _, _, interlace = hdr
assert depth == 8 and ctype in (2, 6) and not interlace, hdr
bpp = 3 if ctype == 2 else 4
data = zlib.decompress(idat)
stride = w * bpp
rows, prev = [], bytearray(stride)
for y in range(h):
    f, line = data[y * (stride + 1)], bytearray(data[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1:
            line[i] = (line[i] + a) & 255
        elif f == 2:
            line[i] = (line[i] + b) & 255
        elif f == 3:
            line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(bytes(line))
    prev = line
counts = {}
for line in rows:
    for i in range(0, stride, bpp):
        px = line[i:i + 3]
        counts[px] = counts.get(px, 0) + 1


def shown(rgb, tol=3):
    return sum(k for px, k in counts.items()
               if all(abs(px[j] - rgb[j]) <= tol for j in range(3)))


root = ET.parse(svg).getroot()
missing = []
for g in root.iter(NS + "g"):
    if g.get("class") != "group":
        continue
    hue, sat, light = (int(x) for x in
                       re.fullmatch(r"hsl\((\d+),(\d+)%,(\d+)%\)",
                                    g.find(NS + "rect").get("fill")).groups())
    rgb = [round(255 * x) for x in colorsys.hls_to_rgb(hue / 360, light / 100, sat / 100)]
    if shown(rgb) < 100:  # a 12x12 swatch is 144 pixels
        missing.append((g.find(NS + "title").text, rgb, shown(rgb)))
assert not missing, ("legend swatches not in the screenshot", missing)
assert shown((0x55, 0x55, 0x55), 0) > 0, "no box drawn"
print("ok: %dx%d screenshot shows every legend swatch" % (w, h))
