"""Where the n-gram drafter's corpus comes from, and its index, built once per machine.

The embedded model ships its own answers (``assets/train-data/<model>*/batch-*.npz``: the token ids
the EAGLE and Medusa heads were trained on, ~10.6M tokens, never MT-bench); for any other model,
``auto`` takes the data ``specchat train-draft MODEL --data-only`` wrote for its weights, and
``--ngram-corpus FOLDER[,FOLDER]`` names folders of such shards. The index
(engine/drafters/ngram_corpus.py) takes ~17 s to build from the shipped shards on the 2-core VM,
so it is built once and cached under ``<cache>/ngram/`` (later sessions read it in ~15 ms): by the
loader, behind the loading screen, when a session starts on n-gram; else on a low-priority
background thread the first time the n-gram drafter is made, while the chat already runs on the
conversation's own n-grams.

Everything the user can get wrong (a folder without shards, shards of another model's vocabulary)
is checked before anything is built, and refused in one line.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from engine.drafters.eagle_checkpoint import DraftLoadError
from engine.drafters.ngram_corpus import CorpusIndex, index_name
from engine.errors import UserError
from engine.files import SMALL_LIMIT, read_text
from engine.jsonl import loads

_ASSETS = Path(__file__).resolve().parents[2] / "assets" / "train-data"
# the folders of the embedded model's own answers (the EAGLE-3 data: CPU, GPU and task prompts)
SHIPPED_CORPUS = {"smollm2-135m": ("smollm2-135m", "smollm2-135m-gpu", "smollm2-135m-tasks")}
INDEXING = "indexing the n-gram corpus (once per machine)"


def shipped_corpus(model_key: str) -> list[Path]:
    """The shipped corpus folders of the embedded model ``model_key`` that are present."""
    return [p for p in (_ASSETS / name for name in SHIPPED_CORPUS.get(model_key, ())) if any(p.glob("batch-*.npz"))]


def generated_corpus(model_folder: Path, cache: Path) -> list[Path]:
    """The data folders ``specchat train-draft --data-only`` wrote for the weights in
    ``model_folder`` (``<cache>/train-data/<hash>``, matched by the weights id in their
    settings.json, whichever form of a GGUF wrote them), so ``--ngram-corpus auto`` finds a
    model's own answers once they exist."""

    from engine.models.resolve import weights_ids

    try:
        wanted = weights_ids(model_folder)
    except (OSError, UserError):
        return []  # no readable config.json there: nothing to match
    found = []
    for settings in sorted((cache / "train-data").glob("*/settings.json")):
        try:
            same = loads(read_text(settings, limit=SMALL_LIMIT)).get("model_id") in wanted
        except (OSError, ValueError, AttributeError, UserError):  # unreadable, not JSON, not an object
            continue
        if same and any(settings.parent.glob("batch-*.npz")):
            found.append(settings.parent)
    return found


def shard_files(folders: Sequence[Path]) -> list[Path]:
    """Every ``batch-*.npz`` of ``folders``; DraftLoadError naming a folder that has none."""
    files: list[Path] = []
    for folder in folders:
        found = sorted(Path(folder).glob("batch-*.npz"))
        if not found:
            raise DraftLoadError(f"--ngram-corpus {folder}: no batch-*.npz shards there (write some with "
                                 "`specchat train-draft --data-only`, or pass --ngram-corpus none)")
        files += found
    return files


def read_documents(files: Sequence[Path], vocab_size: int) -> list[np.ndarray]:
    """Each conversation of the shards as an array of token ids; DraftLoadError for ids the model
    does not have (shards written for another model)."""
    docs: list[np.ndarray] = []
    for f in files:
        try:
            with np.load(f, allow_pickle=False) as z:
                ids, lengths = z["ids"], z["lengths"]
        except (OSError, KeyError, ValueError) as e:
            raise DraftLoadError(f"--ngram-corpus: {f} is not a data shard ({e}); remove it or pass "
                                 "--ngram-corpus none") from None
        if len(ids) and int(ids.max()) >= vocab_size:
            raise DraftLoadError(f"--ngram-corpus: {f} holds token id {int(ids.max())} but the model has "
                                 f"{vocab_size} tokens: the shards were written for another model")
        ends = np.cumsum(lengths)
        docs += np.split(ids, ends[:-1]) if len(lengths) else []
    return docs


class CorpusHandle:
    """The corpus index once it is ready (``index`` is None until then): read from the cache when
    opened, else built on a background thread from the first :meth:`start` (the n-gram drafter's
    creation: a session that never drafts n-grams never builds it) and then cached. The shards
    are read and checked when the handle is made, so bad input is refused before any work; a
    failed build leaves ``error`` set and the drafter on the conversation's own n-grams."""

    def __init__(self, folders: Sequence[Path], vocab_size: int, cache: Path | None) -> None:
        self.folders = [Path(f) for f in folders]
        self.files = shard_files(self.folders)
        self.path = cache / index_name(self.files) if cache is not None else None
        self.index: CorpusIndex | None = None
        self.error: str | None = None
        self._ready = threading.Event()
        self._docs: list[np.ndarray] | None = None
        self._lock = threading.Lock()
        if self.path is not None and self.path.is_file():
            try:
                self.index = CorpusIndex.load(self.path)
            except Exception:  # unreadable, truncated or of another format (safetensors' errors
                self.index = None  # come from Rust without a stable base class): rebuilt
        if self.index is not None:
            self._ready.set()
        else:
            self._docs = read_documents(self.files, vocab_size)

    def start(self) -> CorpusHandle:
        """Build the index on a background thread if it is neither cached nor being built
        (returns self, for factories)."""
        with self._lock:
            docs, self._docs = self._docs, None
        if docs is not None:
            threading.Thread(target=self._build, args=(docs,), name="ngram-corpus", daemon=True).start()
        return self

    def _build(self, docs: list[np.ndarray]) -> None:
        _lower_priority()  # beside a chat, the answer's threads come first
        try:
            index = CorpusIndex.build(docs)
            if self.path is not None:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    index.save(self.path)
                except OSError:
                    pass  # an unwritable cache only costs the next session another build
            self.index = index
        except (MemoryError, ValueError) as e:
            self.error = f"the n-gram corpus could not be indexed ({e}); drafting from the conversation only"
        finally:
            self._ready.set()

    def wait(self, timeout: float | None = None) -> CorpusIndex | None:
        """The index, building it if nobody has started to, waiting up to ``timeout`` seconds."""
        self.start()
        self._ready.wait(timeout)
        return self.index

    def wait_shown(self, progress: Callable[[str, int, int], None] | None) -> CorpusIndex | None:
        """:meth:`wait`, with a progress line while an index is built (the loading screen's, bench's)."""
        if self.ready or progress is None:
            return self.wait()
        progress(INDEXING, 0, 1)
        index = self.wait()
        progress(INDEXING, 1, 1)
        return index

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def describe(self) -> str:
        """One line for the UI and the bench report."""
        names = ", ".join(f.name for f in self.folders)
        if self.index is None:
            state = self.error or ("indexing" if self._docs is None else "not indexed yet")
            return f"n-gram corpus {names}: {state}"
        return f"n-gram corpus {names}: {len(self.index):,} n-grams ({self.index.nbytes / 1e6:.0f} MB)"


def _lower_priority() -> None:
    """Nice this thread (Linux schedules threads one by one) so a build beside a running answer
    takes the cores only while the answer's threads wait; elsewhere, nothing."""
    import contextlib
    import os

    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
