"""The EAGLE methods' registrations (eagle.py, eagle_head.py, eagle_checkpoint.py): EAGLE-1/2 heads
on the target's last hidden state, EAGLE-3 heads on several of its layers."""

from __future__ import annotations

from engine.method_spec import ASSETS, TREE_GRID, TREE_KNOBS, DraftSpec, MethodSpec

LOAD = "engine.drafters.eagle:load_head"  # both kinds: the head's kind is read from its weights

EAGLE = MethodSpec(
    "eagle",
    teaching="EAGLE drafts come from a small head that reads the target's own hidden state and predicts the "
             "next tokens; the numbers are its probabilities.",
    aliases=("eagle2",), knobs=TREE_KNOBS, tree=True, tune_grid=TREE_GRID, features="final_hidden",
    draft=DraftSpec(LOAD),
    sglang="EAGLE", vllm="eagle",
)

EAGLE3 = MethodSpec(
    "eagle3",
    teaching="EAGLE-3 drafts come from a small head fed with several of the target's layers; the numbers are "
             "its probabilities.",
    knobs=TREE_KNOBS, tree=True, tune_grid=TREE_GRID, features="layers",
    # the head trained for the embedded model (issue 8), loaded with every session on it so that
    # eagle3 can be chosen mid-chat
    draft=DraftSpec(LOAD, shipped={"smollm2-135m": ASSETS / "eagle3-smollm2-135m"}, preload=True),
    sglang="EAGLE3", vllm="eagle3", llamacpp="draft-eagle3",
    llamacpp_note="llama.cpp reads an EAGLE-3 draft as a GGUF made by its own converter from the head's "
                  "checkpoint; the safetensors head specchat runs is not one",
)

METHODS = (EAGLE, EAGLE3)
