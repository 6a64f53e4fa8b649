"""Re-pack image data files (``.npz`` with a uint8 ``x`` of shape N×H×W×C) smaller, to carry them to a machine that
takes only a few tens of MB, and rebuild them there.

``pack`` stores ``x`` as lossless WebP mosaics (up to 100 × 100 images each) and every other array as it is, with the
sha256 of ``x``'s bytes and of the original file. ``unpack`` rebuilds the file with ``numpy.savez_compressed``,
checks the pixels against that sha256 (a mismatch stops it) and compares the rebuilt file's sha256 with the original:
exit status 0 when the bytes are identical too, 3 when only the arrays are (another zlib wrote the container;
compute there with ``compute_runs.py --no-verify``, the run's numbers do not depend on it).

The project's CIFAR-10 copy (85 MB as ``.npz``) packs to about 43 MB; packing takes about 4 minutes on one core and
unpacking 5 seconds. WebP (through Pillow) is used because it is the best lossless image codec Pillow writes; zstd
or xz gain nothing on these already-deflated files.

    python scripts/repack_data.py pack ../shared/data pack/ --files cifar10_train.npz cifar10_test.npz
    python scripts/repack_data.py unpack pack/ data/          # on the other machine
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

MAX_SIDE = 100
"""Images per mosaic side: 100 × 100 images of 32 px make a 3,200 px square (WebP allows 16,383)."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack_file(path: Path, out: Path) -> dict:
    """Pack one ``.npz`` into ``out``; returns its index entry (file name, mosaic count and side, sha256s)."""
    from PIL import Image

    with np.load(path) as arrays:
        contents = {name: arrays[name] for name in arrays.files}
    x = contents.get("x")
    if x is None or x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] not in (1, 3):
        raise ValueError(f"{path.name}: needs a uint8 array 'x' of shape N×H×W×C with C in (1, 3), got "
                         f"{None if x is None else (x.dtype, x.shape)}")
    n, height, width, channels = x.shape
    side = min(MAX_SIDE, math.ceil(math.sqrt(n)))
    per = side * side
    stem = path.name.removesuffix(".npz")
    mosaics = 0
    for start in range(0, n, per):
        chunk = x[start:start + per]
        if len(chunk) < per:
            chunk = np.concatenate([chunk, np.zeros((per - len(chunk), height, width, channels), np.uint8)])
        tile = chunk.reshape(side, side, height, width, channels).transpose(0, 2, 1, 3, 4)
        tile = tile.reshape(side * height, side * width, channels)
        Image.fromarray(tile.squeeze(-1) if channels == 1 else tile).save(
            out / f"{stem}.{mosaics}.webp", "WEBP", lossless=True, quality=100, method=6)
        mosaics += 1
    rest = {name: value for name, value in contents.items() if name != "x"}
    np.savez_compressed(out / f"{stem}.rest.npz", **rest)
    return {"file": path.name, "order": list(contents), "shape": list(x.shape), "side": side, "mosaics": mosaics,
            "x_sha256": _sha256(x.tobytes()), "file_sha256": _sha256(path.read_bytes())}


def unpack_file(entry: dict, packed: Path, out: Path) -> bool:
    """Rebuild ``entry['file']`` into ``out``; True when its bytes equal the original's (pixels are always checked)."""
    from PIL import Image

    n, height, width, channels = entry["shape"]
    side, stem = entry["side"], entry["file"].removesuffix(".npz")
    tiles = []
    for i in range(entry["mosaics"]):
        image = np.asarray(Image.open(packed / f"{stem}.{i}.webp").convert("RGB" if channels == 3 else "L"))
        image = image.reshape(side, height, side, width, channels).transpose(0, 2, 1, 3, 4)
        tiles.append(image.reshape(side * side, height, width, channels))
    x = np.ascontiguousarray(np.concatenate(tiles)[:n])
    if _sha256(x.tobytes()) != entry["x_sha256"]:
        raise ValueError(f"{entry['file']}: the unpacked pixels differ from the packed file's (sha256 of x)")
    with np.load(packed / f"{stem}.rest.npz") as rest:
        contents = {name: (x if name == "x" else rest[name]) for name in entry["order"]}
    target = out / entry["file"]
    np.savez_compressed(target, **contents)
    return _sha256(target.read_bytes()) == entry["file_sha256"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pack = sub.add_parser("pack", help="pack .npz files of a folder")
    pack.add_argument("source", type=Path)
    pack.add_argument("out", type=Path)
    pack.add_argument("--files", nargs="+", required=True, help="file names in the source folder")
    unpack = sub.add_parser("unpack", help="rebuild the packed files")
    unpack.add_argument("packed", type=Path)
    unpack.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "pack":
        missing = [name for name in args.files if not (args.source / name).is_file()]
        if missing:
            parser.error(f"--files: not found in {args.source}: {missing}")
        args.out.mkdir(parents=True, exist_ok=True)
        index = [pack_file(args.source / name, args.out) for name in args.files]
        (args.out / "index.json").write_text(json.dumps(index, indent=1))
        print(f"packed {len(index)} file(s) into {args.out}")
        return 0
    index_path = args.packed / "index.json"
    if not index_path.is_file():
        parser.error(f"packed: {args.packed} holds no index.json (write one with the pack command)")
    args.out.mkdir(parents=True, exist_ok=True)
    identical = [unpack_file(entry, args.packed, args.out) for entry in json.loads(index_path.read_text())]
    for entry, same in zip(json.loads(index_path.read_text()), identical):
        print(f"{entry['file']}: arrays identical; file bytes {'identical' if same else 'differ'}")
    return 0 if all(identical) else 3


if __name__ == "__main__":
    sys.exit(main())
