"""Resizes raw 8-bit RGB images with Pillow's Lanczos filter, for the C++ test of
io::pillow_lanczos_resize (tests/test_flux_pipeline.cpp): the reference bytes come from Pillow
itself (Debian's python3-pil), not from a copy of its algorithm.

usage: pillow_resize.py LIST   where each line of LIST is "IN.raw H W OUT.raw OH OW"
"""
import sys

from PIL import Image

for line in open(sys.argv[1]):
    src, h, w, dst, oh, ow = line.split()
    with open(src, "rb") as f:
        image = Image.frombytes("RGB", (int(w), int(h)), f.read())
    out = image.resize((int(ow), int(oh)), Image.LANCZOS)
    with open(dst, "wb") as f:
        f.write(out.tobytes())
