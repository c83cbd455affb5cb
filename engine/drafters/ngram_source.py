"""Where the conversation matches one token only: draft from it, or from the corpus?

The n-gram drafter drafts from the conversation where the text so far ends like an earlier
stretch of it, and from a corpus of the model's own answers where it does not. A one-token match
is the case in between, and the better source depends on the task. Replayed on the greedy answers
(session 33, the 2-core Zen 5 EPYC; tokens a full tree would have committed at such steps): on
the 80 MT-bench first turns the corpus 0.73-0.78 against the conversation's 0.63-0.64, on the
rewrite prompts the conversation 0.76-2.18 against the corpus's 0.49-0.64 (an answer that copies
its prompt continues after a rare word as the prompt did). A fixed rule serves one kind of
answer and taxes the other.

So :class:`SourceChoice` learns it per conversation, paired: at each one-token match the drafter
builds both trees, drafts with the one whose running score is higher, and once the target has
spoken scores both on what it said (the tokens committed after the root, and the next root), each
tree walked as the verifier walks it, both capped at what is known. Paired, because both are
scored on the same steps: two sources judged on different stretches of text judge the text.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.tree import DraftTree

# running scores (tokens a tree commits) before any evidence: the conversation first. Replayed with
# real steps (each tree walked as verified, unpruned; same answers): on MT-bench always the corpus
# 2.150 tokens a step, always the conversation 2.142, learned from the corpus first 2.167 and from
# the conversation first 2.165; on rewrite 3.240 / 3.463 / 3.341 / 3.422: an answer's first
# one-token matches come before any evidence, and there the conversation costs chat nothing
_CONVERSATION_PRIOR, _CORPUS_PRIOR = 0.8, 0.75
_LEARN = 0.2  # weight of a new paired score


def committed_along(tree: DraftTree, truth: list[int]) -> int:
    """How many of ``truth`` (the tokens after the root, as far as known) a greedy verify of
    ``tree`` would have kept."""
    children = tree.children()
    node = kept = 0
    for token in truth:
        nxt = next((c for c in children[node] if tree.tokens[c] == token), None)
        if nxt is None:
            break
        node, kept = nxt, kept + 1
    return kept


@dataclass
class SourceChoice:
    """The paired running scores of the conversation's and the corpus's trees at one-token matches."""

    conversation: float = _CONVERSATION_PRIOR
    corpus: float = _CORPUS_PRIOR
    # the last pair offered: (position of its root, conversation tree, corpus tree)
    _pending: tuple[int, DraftTree, DraftTree] | None = None

    def choose(self, position: int, conversation: DraftTree, corpus: DraftTree) -> DraftTree:
        """The tree to draft with at a one-token match whose root sits at ``position``; both are
        scored once the tokens after the root are known (:meth:`score`)."""
        self._pending = (position, conversation, corpus)
        return conversation if self.conversation > self.corpus else corpus

    def score(self, tokens: list[int], root: int) -> None:
        """Score the pending pair on what the target said: ``tokens`` are the committed tokens
        (the pair's root included, at its position), ``root`` the token produced after them."""
        if self._pending is None:
            return
        position, conversation, corpus = self._pending
        self._pending = None
        if position >= len(tokens):  # cut back since (a truncation): nothing to learn from
            return
        truth = [*tokens[position + 1:], root]
        self.conversation += _LEARN * (committed_along(conversation, truth) - self.conversation)
        self.corpus += _LEARN * (committed_along(corpus, truth) - self.corpus)

    def forget(self) -> None:
        """Drop the pending pair (the drafter was reset or cut back)."""
        self._pending = None
