"""What a drafting method declares about itself, once: :class:`MethodSpec`.

Why one declaration: a method's names, knobs, draft, features, server names and plain-words
sentence used to be written out in eight files (the engine's drafters and loader, the options,
export, the settings, teaching, the GPU bench), each with its own tuple of names. Each method
now declares one ``MethodSpec`` beside its code (``engine/drafters/*_method.py``), the registry
(``engine/methods.py``) collects them, and every list of methods is generated from it
(tests/test_methods.py checks that no product file keeps its own).

No imports beyond the standard library: the CLI's parser reads the registry before anything
heavy loads, and a registration names its loader as ``"module:function"`` (imported when a
draft is loaded), so declaring a method never imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# the target states a drafter reads (engine/features.py builds the FeatureSpec): the post-norm last
# hidden state, or the residual entering the layers the draft names (EAGLE-3's capture layers)
Features = Literal["final_hidden", "layers"]

# the knobs of a method that grows a tree level by level (SGLang's names)
TREE_KNOBS = ("num_steps", "eagle_topk", "num_draft_tokens")

# what specchat tune sweeps for a tree method: SGLang's ranges (its serving guide: num-steps 3-6,
# eagle-topk 4-8, num-draft-tokens 32-64), and topk 1, a chain
TREE_GRID: Mapping[str, tuple[int, ...]] = {"num_steps": (3, 4, 5, 6), "eagle_topk": (1, 4, 6, 8),
                                             "num_draft_tokens": (32, 48, 64)}

ASSETS = Path(__file__).resolve().parents[1] / "assets"  # where shipped heads live


def resolve(target: str) -> Any:
    """``"package.module:attribute"`` -> the attribute (the module imported now)."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class DraftSpec:
    """How a method that takes ``--draft`` finds and loads it."""

    # "module:function": (checked draft, target, tokenizer) -> DraftBundle, the load_draft branch of
    # this method (engine/drafters/draft_loader.py reads and checks the files first)
    load: str
    # model key -> the folder of the head shipped for that model (used without --draft)
    shipped: Mapping[str, Path] = field(default_factory=dict)
    # its shipped head loads under the methods that take no draft too, so it can be chosen mid-chat
    preload: bool = False
    # a draft in a format of its own: "module:function" (config.json as a dict) -> whether the draft
    # is this method's, and "module:function" (config, weights or their headers, the target's
    # config, label) -> the parts ``load`` builds from, raising DraftLoadError (one line) for a draft
    # that does not fit the target; both run before any target loads. "": one of the formats
    # draft_loader tells apart itself (EAGLE heads, Medusa heads, a language model)
    claims: str = ""
    read: str = ""


@dataclass(frozen=True)
class MethodSpec:
    """One drafting method, as every surface names and treats it."""

    name: str  # SpecConfig.method, --method NAME
    teaching: str = ""  # where its drafts come from, in one plain sentence (teaching mode)
    aliases: tuple[str, ...] = ()  # other --method names for it (any case): eagle2 -> eagle
    note: str = ""  # said beside its name in --method's help ("the baseline"); else its aliases
    knobs: tuple[str, ...] = ()  # the SpecConfig fields that act on it (engine/knobs.py names)
    # its own defaults for some of ``knobs``, over engine/knobs.py's: what a knob the user did not set
    # is under this method (SpecConfig.for_method; engine.config.method_defaults checks them)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # it grows a tree of SpecConfig.tree_width (--speculative-eagle-topk) over num_steps levels;
    # width 1 is a chain (engine.methods.chain_size)
    tree: bool = False
    features: Features | None = None  # target states its drafter reads (None: none)
    draft: DraftSpec | None = None  # takes --draft (None: drafts without one)
    # "module:attribute" of the drafter class of a method that takes no draft (the session's defaults)
    drafter: str = ""
    draft_probs: bool = True  # its drafts carry the drafter's probabilities (n-gram's do not)
    # its drafter fills a whole block in one forward, every position at once (each blind to the guesses
    # before it), so its steps can show each position's candidates (Step.block): the tree panel, teaching
    block: bool = False
    sglang: str | None = None  # --speculative-algorithm value; None: SGLang has no such algorithm
    vllm: str | None = None  # speculative_config "method"; None: vLLM has none
    llamacpp: str | None = None  # llama.cpp's --spec-type value; None: llama.cpp has none
    llamacpp_note: str = ""  # what a llama-server line of it must say ("": nothing of its own)
    # what an SGLang line cannot carry over of these settings (SpecConfig -> notes)
    sglang_notes: Callable[[Any], list[str]] | None = None
    # the knobs its SGLang algorithm takes (None: every knob of ``knobs`` SGLang has a flag for); a
    # knob left out is specchat's own for this method (a block drafter's tree width, where SGLang verifies chains)
    sglang_knobs: tuple[str, ...] | None = None
    # vLLM's speculative_config fields after "method" for these settings (config, draft, notes) ->
    # dict; None: the draft-chain form (model, num_speculative_tokens = num_steps), specchat/export.py
    vllm_config: Callable[[Any, str | None, list[str]], dict[str, Any]] | None = None
    # vLLM's chain note for a tree setting (config -> note); None: export's generic one
    vllm_chain_note: Callable[[Any], str] | None = None
    # why bench --random-weights cannot time it ("": it can, given a head)
    random_weights: str = ""
    # the values specchat tune sweeps for each knob (empty: tune has no grid for it)
    tune_grid: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    @property
    def help_name(self) -> str:
        """How --method's help lists it: ``eagle (eagle2)``, ``none (the baseline)``."""
        extra = self.note or ", ".join(self.aliases)
        return f"{self.name} ({extra})" if extra else self.name

    @property
    def takes_draft(self) -> bool:
        return self.draft is not None

    @property
    def one_pass_tree(self) -> bool:
        """It reads the tree width but grows no levels: its tree is searched over what one drafter
        forward gave (a block drafter's DDTree), so the adaptive budget chooses chain or tree for it
        (engine/adaptive.py, WidthChoice), never a depth to save forwards."""
        return not self.tree and "eagle_topk" in self.knobs
