"""The DFlash method's registration (this folder): a block drafter that reads several target layers
and proposes a whole block of tokens in one forward, verified as a chain or as a DDTree.

Its knobs: the block's size as SGLang names it for DFLASH, ``--speculative-num-draft-tokens`` (the
anchor included): a chain step verifies min(num_draft_tokens, the drafter's block_size) - 1
guesses, and a DDTree holds num_draft_tokens nodes, the root included (its node budget); and the
tree width ``--speculative-eagle-topk`` (SpecConfig.tree_width): candidates per block position, 1
a chain. DDTree is this method, not one of its own: the same drafter, the same forward and the same
servers' names, only the shape of what is verified differs. SGLang's DFLASH pins top-k to 1 and
vLLM's ``dflash`` and llama.cpp's ``draft-dflash`` verify chains (DDTree is an open pull request in
each), so the width is specchat's own: export leaves it out (``sglang_knobs``) and says so.
vLLM's ``num_speculative_tokens`` and llama.cpp's ``--spec-draft-n-max`` are the chain's guesses.

Its defaults are SGLang's for DFLASH, not the tree methods' (``defaults`` below): a chain, and a block
of 16.
"""

from __future__ import annotations

from typing import Any

from engine.method_spec import ASSETS, DraftSpec, MethodSpec

_HERE = "engine.drafters.dflash"


def sglang_notes(config: Any) -> list[str]:
    """What SGLang's DFLASH line cannot carry over: a DDTree (width above 1)."""
    if config.eagle_topk <= 1:
        return []
    return [f"SGLang's DFLASH verifies each block as a chain (its top-k is 1): the DDTree of eagle_topk="
            f"{config.eagle_topk} candidates a position and num_draft_tokens={config.num_draft_tokens} nodes does "
            "not carry over; the line drafts the block's num_draft_tokens - 1 guesses a step"]

DFLASH = MethodSpec(
    "dflash",
    teaching="DFlash drafts a whole block in one pass: a small model that reads several of the target's layers "
             "fills every position after the last token at once. Each position is guessed without seeing the "
             "guesses before it, so the later positions are accepted less often; the numbers are its probabilities.",
    knobs=("eagle_topk", "num_draft_tokens"), sglang_knobs=("num_draft_tokens",), sglang_notes=sglang_notes,
    # SGLang's DFLASH pins top-k to 1 (a chain: a DDTree is asked for with --speculative-eagle-topk K), and
    # an unset tree size there is the drafter's block_size, 16 where its config names none; z-lab's lines
    # give 16 for their b16 drafters. A registration cannot read the drafter, so 16: a chain step verifies
    # min(num_draft_tokens, block_size) - 1 guesses, so a drafter of any block up to 16 (z-lab's, the
    # block-8 one shipped for the embedded model) runs its whole trained block, as SGLang runs it
    defaults={"eagle_topk": 1, "num_draft_tokens": 16},
    features="layers", block=True,
    # the drafter trained for the embedded model (session 44; weak: its card says so), loaded when dflash is
    # asked for on it without --draft, so block drafting can be watched and taught there
    draft=DraftSpec(f"{_HERE}.drafter:load_drafter", shipped={"smollm2-135m": ASSETS / "dflash-smollm2-135m"},
                    claims=f"{_HERE}.checkpoint:is_dflash_config", read=f"{_HERE}.checkpoint:read_dflash"),
    sglang="DFLASH", vllm="dflash", llamacpp="draft-dflash",
    llamacpp_note="llama.cpp reads a DFlash drafter as a GGUF made by its own converter (convert_hf_to_gguf.py) from "
                  "the drafter's checkpoint; the safetensors folder specchat runs is not one",
    random_weights="it builds EAGLE-3 heads only; give a DFlash drafter with --draft PATH and bench it with "
                   "--prompts on a real model",
    tune_grid={"eagle_topk": (1, 2, 4), "num_draft_tokens": (4, 8, 12, 16)},
)

METHODS = (DFLASH,)
