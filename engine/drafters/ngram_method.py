"""The n-gram method's registration (ngram.py): drafts copied from earlier text, no draft to load."""

from __future__ import annotations

from typing import Any

from engine.method_spec import MethodSpec

KNOBS = ("num_draft_tokens", "ngram_min_match_window_size", "ngram_max_match_window_size",
         "ngram_min_bfs_breadth", "ngram_max_bfs_breadth", "ngram_match_type", "ngram_max_trie_depth",
         "ngram_capacity", "ngram_mode", "ngram_corpus")


def sglang_notes(config: Any) -> list[str]:
    """What SGLang's n-gram drafter does not take of these settings."""
    notes = []
    if config.ngram_mode == "chain":
        notes.append("ngram_mode chain is specchat's prompt-lookup mode; SGLang always drafts its trie's tree")
    notes.append("ngram_capacity does not carry over: SGLang's --speculative-ngram-capacity counts "
                 "tokens (default 10M), ours counts trie nodes")
    if config.ngram_corpus:
        notes.append("ngram_corpus is specchat's: SGLang's n-gram drafter reads the requests' own tokens only, "
                     "so free chat drafts less there")
    return notes


def vllm_config(config: Any, draft: str | None, notes: list[str]) -> dict[str, Any]:
    """vLLM's n-gram is prompt lookup: one chain, the match window as prompt_lookup_min/max."""
    drafts = config.num_draft_tokens - 1
    notes.append(f"vLLM's n-gram is prompt lookup: one chain of {drafts} tokens (num_draft_tokens - 1); "
                 "the match window becomes prompt_lookup_min/max; BFS breadth, match type, trie depth and "
                 "capacity have no vLLM counterpart")
    return {"num_speculative_tokens": drafts, "prompt_lookup_min": config.ngram_min_match_window_size,
            "prompt_lookup_max": config.ngram_max_match_window_size}


NGRAM = MethodSpec(
    "ngram",
    teaching="n-gram drafts are copied from earlier text (the prompt and the answer so far) where the last "
             "few tokens matched the current ones; they come with no probabilities.",
    knobs=KNOBS, drafter="engine.drafters.ngram:NgramDrafter", draft_probs=False,
    tune_grid={"num_draft_tokens": (4, 8, 16, 32, 64), "ngram_max_bfs_breadth": (1, 4, 10)},
    sglang="NGRAM", vllm="ngram", llamacpp="ngram-simple", sglang_notes=sglang_notes, vllm_config=vllm_config,
    random_weights="its drafts are looked up in the text, and random weights write none worth matching; bench it "
                   "with --prompts on a real model",
)

METHODS = (NGRAM,)
