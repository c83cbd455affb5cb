"""The test suite's own specchat cache: a folder per run, so no test writes into the user's.

Why: every test that resolves a GGUF, builds the native kernel or indexes an n-gram corpus writes
under ``cache_dir()``; without this, each run left converted copies of its tiny random GGUFs
(``models/gguf-target-<hash>``, one per tmp path) in ``~/.cache/specchat`` for good.

Why not an empty folder: some of what the suite makes is slow to make and the same on every run
(the embedded model's conversion, the compiled kernels, the shipped corpus's n-gram index). Those
caches are keyed by their inputs (a source's size and stamp, a hash of the C sources, the shards'
stat), so the user's copies are linked in read-only-by-convention: a stale one is replaced beside
the link, never written through it (the conversion, kernel and index writers all rename into
place). What the suite makes of a file outside the temporary folders is handed over to the user's
cache at the end, so the next run need not make it again; whatever else it made dies with the run.

The slow real-model tests read and write their large downloads in the user's cache on purpose:
:func:`user_cache` names it, and what they say they write there is not a leak.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.drafters.corpus_files import SHIPPED_CORPUS, shard_files, shipped_corpus
from engine.drafters.ngram_corpus import index_name
from engine.jsonl import loads
from engine.models.resolve import MANIFEST, _install, _is_complete, cache_dir

ENV = "SPECCHAT_CACHE_DIR"
# the cache areas whose entries are keyed by their inputs: sharing them cannot change a result
SHARED_AREAS = ("models", "kernels", "ngram")
KERNEL_NAME = re.compile(r"specchat-cpu-\w+-[0-9a-f]{16}\.so")  # engine/kernels/build.py's, not a build's temp file

Snapshot = dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns); (-1, 0) for a folder


@dataclass
class SuiteCache:
    user: Path  # the cache the user's own runs use
    root: Path  # this run's cache
    saved_env: str | None  # $SPECCHAT_CACHE_DIR as the run found it
    before: Snapshot  # the user's cache when the run began
    claimed: set[str] = field(default_factory=set)  # entries of the user's cache tests write on purpose
    handed_over: list[Path] = field(default_factory=list)


_current: SuiteCache | None = None


def start() -> SuiteCache:
    """Point ``$SPECCHAT_CACHE_DIR`` at a new folder holding links to the user's shared entries.
    Called before collection: test modules call ``native.load()`` at import, which builds into
    ``cache_dir()`` and keeps the library for the whole process."""
    global _current
    user = cache_dir()
    root = Path(tempfile.mkdtemp(prefix="specchat-suite-cache-"))
    for area in SHARED_AREAS:
        (root / area).mkdir()
        for entry in _entries(user / area):
            (root / area / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    _current = SuiteCache(user, root, os.environ.get(ENV), snapshot(user))
    os.environ[ENV] = str(root)
    return _current


def user_cache(*entries: str) -> Path:
    """The user's own cache folder (the slow tests keep their large downloads there); ``entries``
    are the names under it the caller may create, which the end-of-run check then accepts."""
    cache = _require()
    cache.claimed.update(entries)
    return cache.user


def finish(basetemp: Path) -> tuple[list[str], list[str]]:
    """Hand over what the run made from files outside the temp folders (pytest's ``basetemp``, the
    system's, this run's cache), then name what else appeared or changed in the user's cache, in two
    lists: the leaks this run provably made (a conversion of one of its own temp files, or a new
    entry at the top of the cache, where specchat itself writes nothing new), and the changes it
    cannot tell from another program's (another checkout's suite, or the user's own specchat
    writing a conversion, a kernel or an index meanwhile). Only the first fail the run: a verdict
    must not depend on what else the machine runs."""
    cache = _require()
    own = [basetemp.resolve(), cache.root.resolve()]
    for made in _handovers(cache.root, [*own, Path(tempfile.gettempdir()).resolve()]):
        destination = cache.user / made.relative_to(cache.root)
        _hand_over(made, destination)
        cache.handed_over.append(destination)
    allowed = [*cache.handed_over, *(cache.user / name for name in cache.claimed)]
    found = leaks(cache.before, snapshot(cache.user), cache.user, allowed)
    return split_leaks(found, cache.before, cache.user, own)


def split_leaks(found: list[str], before: Snapshot, folder: Path, own: list[Path]) -> tuple[list[str], list[str]]:
    """``found`` (paths under ``folder``) as (this run's, anyone's): this run's are conversions of
    files under ``own`` and new entries at the top, beside none of the areas ``before`` had."""
    areas = {*SHARED_AREAS, *(rel for rel in before if os.sep not in rel)}
    ours = [rel for rel in found if rel.split(os.sep)[0] not in areas or _made_here(folder / rel, own)]
    return ours, [rel for rel in found if rel not in ours]


def stop() -> None:
    """Put ``$SPECCHAT_CACHE_DIR`` back and remove this run's cache (the links only, never their targets)."""
    global _current
    cache = _require()
    if cache.saved_env is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = cache.saved_env
    shutil.rmtree(cache.root, ignore_errors=True)  # rmtree unlinks a link; it never follows one
    _current = None


def _require() -> SuiteCache:
    if _current is None:
        raise RuntimeError("the suite cache was not started (tests/conftest.py starts it; import this module "
                           "as tests.suite_cache, the name conftest uses)")
    return _current


def _entries(folder: Path) -> list[Path]:
    """The finished entries of a cache area (a conversion under way is a hidden folder)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and not p.is_symlink())


# hand-over ----------------------------------------------------------------------------------
def _handovers(root: Path, temporary: list[Path]) -> list[Path]:
    """What the run made that the user's next run would make the same way: conversions of a file
    outside the temp folders, compiled kernels, the shipped corpus's index."""
    made = [p for p in _entries(root / "models") if _converted_from_outside(p, temporary)]
    made += [p for p in _entries(root / "kernels") if KERNEL_NAME.fullmatch(p.name)]
    shipped = _shipped_index_names()
    made += [p for p in _entries(root / "ngram") if p.name in shipped]
    return made


def _made_here(folder: Path, own: list[Path]) -> bool:
    """Whether ``folder`` is a conversion of a file under one of ``own``, this run's temp folders:
    no other program knows those files."""
    try:
        source = Path(_expected(folder)["source"]).resolve()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return any(source.is_relative_to(t) for t in own)


def _converted_from_outside(folder: Path, temporary: list[Path]) -> bool:
    """Whether ``folder`` is a finished conversion (every file its manifest lists, at its size) of a
    file outside the temp folders."""
    try:
        expected = _expected(folder)
        source = Path(expected["source"]).resolve()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no manifest: not a finished one
        return False
    return _is_complete(folder, expected) and not any(source.is_relative_to(t) for t in temporary)


def _expected(folder: Path) -> dict[str, Any]:
    """What ``resolve._is_complete`` checks a folder against: its manifest less the file list and date."""
    manifest = loads((folder / MANIFEST).read_text(encoding="utf-8"))
    return {k: v for k, v in manifest.items() if k not in ("files", "created")}



def _shipped_index_names() -> set[str]:
    """The index file names of the embedded model's shipped corpus (those present in this tree)."""
    names = set()
    for key in SHIPPED_CORPUS:
        folders = shipped_corpus(key)
        if folders:
            names.add(index_name(shard_files(folders)))
    return names


def _hand_over(made: Path, destination: Path) -> None:
    """Move ``made`` into the user's cache atomically: beside its place under a hidden name first
    (a copy when the folders are on two disks), then renamed, so a concurrent run sees the old
    entry or the new one, never half of one."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    aside = destination.with_name(f".{destination.name}.suite-{os.getpid()}")
    shutil.move(made, aside)
    if aside.is_dir():
        try:
            _install(aside, destination, _expected(aside))  # replaces a stale one; keeps a finished one
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(aside, destination)


# the check ----------------------------------------------------------------------------------
def snapshot(folder: Path) -> Snapshot:
    """Every path under ``folder`` (links not followed) with its file's size and mtime."""
    found: Snapshot = {}
    for parent, dirs, files in os.walk(folder):
        for name in dirs:
            found[os.path.relpath(os.path.join(parent, name), folder)] = (-1, 0)
        for name in files:
            path = os.path.join(parent, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # removed while we looked
                continue
            found[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
    return found


def leaks(before: Snapshot, after: Snapshot, folder: Path, allowed: list[Path]) -> list[str]:
    """The paths of ``after`` that ``before`` lacked or held with another size or mtime (a new
    folder named, not its files), except those at or under ``allowed`` (or folders above them,
    which a hand-over may have created)."""
    kept = [os.path.relpath(p, folder) for p in allowed]

    def accepted(rel: str) -> bool:
        return any(rel == k or rel.startswith(k + os.sep) or (after[rel][0] < 0 and k.startswith(rel + os.sep))
                   for k in kept)

    found = sorted(rel for rel, stat in after.items() if before.get(rel) != stat and not accepted(rel))
    return [rel for rel in found if not any(rel.startswith(top + os.sep) for top in found)]  # a new folder once
