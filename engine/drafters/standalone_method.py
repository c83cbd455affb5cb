"""The standalone method's registration (standalone.py): a small model with the target's tokenizer."""

from __future__ import annotations

from engine.method_spec import TREE_GRID, TREE_KNOBS, DraftSpec, MethodSpec

STANDALONE = MethodSpec(
    "standalone",
    teaching="Standalone drafts come from a small language model running on its own; the numbers are its "
             "probabilities.",
    knobs=TREE_KNOBS, tree=True, tune_grid=TREE_GRID, draft=DraftSpec("engine.drafters.standalone:load_model_draft"),
    sglang="STANDALONE", vllm="draft_model", llamacpp="draft-simple",
    random_weights="a draft model must share the target's tokenizer and a random target has none; bench it with "
                   "--prompts on a real model",
)

METHODS = (STANDALONE,)
