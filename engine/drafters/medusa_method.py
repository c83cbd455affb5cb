"""The Medusa method's registration (medusa.py, medusa_checkpoint.py): K heads on the target's last
hidden state, one per future position."""

from __future__ import annotations

from typing import Any

from engine.method_spec import ASSETS, TREE_GRID, TREE_KNOBS, DraftSpec, MethodSpec


def vllm_chain_note(config: Any) -> str:
    return (f"vLLM's Medusa drafts one chain from the heads: medusa_tree={config.medusa_tree} does not "
            "carry over; num_speculative_tokens = num_steps, at most the number of heads")


MEDUSA = MethodSpec(
    "medusa",
    teaching="Medusa drafts come from independent heads on the target's last hidden state, one per future "
             "position: head i guesses the token i+1 places ahead, all heads at once, and the tree is the "
             "product of their top-k candidates. No head sees the tokens before the position it guesses (unlike "
             "EAGLE's head, which runs on its own guesses), so the deeper heads miss more; the numbers are the "
             "heads' probabilities.",
    knobs=(*TREE_KNOBS, "medusa_tree"), tree=True, tune_grid=TREE_GRID, features="final_hidden",
    # the heads trained for the embedded model (issue 21)
    draft=DraftSpec("engine.drafters.medusa:load_heads", shipped={"smollm2-135m": ASSETS / "medusa-smollm2-135m"}),
    sglang=None, vllm="medusa", vllm_chain_note=vllm_chain_note,
    random_weights="it builds EAGLE-3 heads only; give a Medusa head with --draft PATH and bench it with "
                   "--prompts on a real model",
)

METHODS = (MEDUSA,)
