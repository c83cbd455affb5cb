"""The DFlash method's registration (this folder): a block drafter that reads several target layers
and proposes a whole block of tokens in one forward.

Its one knob is the block's size as SGLang names it for DFLASH, ``--speculative-num-draft-tokens``
(the anchor included; SGLang pins num_steps and top-k to 1 there): a step verifies
min(num_draft_tokens, the drafter's block_size) - 1 guesses. vLLM's ``num_speculative_tokens`` and
llama.cpp's ``--spec-draft-n-max`` are that count of guesses.
"""

from __future__ import annotations

from engine.method_spec import DraftSpec, MethodSpec

_HERE = "engine.drafters.dflash"

DFLASH = MethodSpec(
    "dflash",
    teaching="DFlash drafts a whole block in one pass: a small model that reads several of the target's layers "
             "fills every position after the last token at once. Each position is guessed without seeing the "
             "guesses before it, so the later positions are accepted less often; the numbers are its probabilities.",
    knobs=("num_draft_tokens",), features="layers", block=True,
    draft=DraftSpec(f"{_HERE}.drafter:load_drafter", claims=f"{_HERE}.checkpoint:is_dflash_config",
                    read=f"{_HERE}.checkpoint:read_dflash"),
    sglang="DFLASH", vllm="dflash", llamacpp="draft-dflash",
    llamacpp_note="llama.cpp reads a DFlash drafter as a GGUF made by its own converter (convert_hf_to_gguf.py) from "
                  "the drafter's checkpoint; the safetensors folder specchat runs is not one",
    random_weights="it builds EAGLE-3 heads only; give a DFlash drafter with --draft PATH and bench it with "
                   "--prompts on a real model",
    tune_grid={"num_draft_tokens": (4, 8, 12, 16)},
)

METHODS = (DFLASH,)
