"""Plain-words explanations of a step, and the help text (no Textual imports)."""

from __future__ import annotations

from engine import methods
from engine.events import Step
from engine.tree import DraftTree
from specchat.tui.token_text import visible


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _quote(pieces: list[str]) -> str:
    return "‹" + "".join(pieces).replace("\n", "↵") + "›"


# Where each drafter's guesses come from, in one plain sentence (each method's registration says it).
def draft_sources() -> dict[str, str]:
    return {m.name: m.teaching for m in methods.all_methods() if m.teaching}


# The compare view, when method A and method B are both speculative: what the depth table shows.
COMPARE_DEPTHS = (
    "The table gives each method's accepted share at depth 1, 2, 3...: of the steps whose tree reached that "
    "depth, how many kept a drafted token there. Medusa's heads guess every position at once from one hidden "
    "state, and a block drafter fills a whole block in one pass, each position blind to the tokens before it, "
    "so their share falls quickly with depth; EAGLE's head "
    "drafts level by level on its own guesses and keeps the deep levels useful for longer. Each method's "
    "speed-up is against the baseline, run on the same prompt from the same cache state."
)

PROBABILITIES = ("A number beside a draft is the drafter's probability for it given its parent: how sure the "
                 "drafter was. The target keeps a draft only if it would have produced it itself.")


# An n-gram step drafted from the n-gram drafter's second source (DraftTree.source == "corpus").
CORPUS_SOURCE = ("These n-gram drafts come from the model's own past answers: nothing earlier in this "
                 "conversation matched (or only the last token did, and past answers have been drafting "
                 "better in this conversation), so the drafter looked the last few tokens up in counts of what "
                 "the model wrote next in thousands of other answers; the numbers are the share of those "
                 "answers that went on that way.")


def draft_source(method: str, tree: DraftTree | None = None) -> str:
    if tree is not None and tree.source == "corpus":
        return CORPUS_SOURCE
    return draft_sources().get(method, "")


def explain_step(step: Step, method: str = "", *, prompt_tokens: int = 0) -> str:
    """What happened in one step, for a newcomer. Step 0 is the prefill."""
    tree = step.tree
    t = step.timing
    n_commit = len(step.committed)
    if step.index == 0:
        first = step.committed[0].text if step.committed else ""
        read = f"the {_plural(prompt_tokens, 'token')} of the prompt" if prompt_tokens else "the prompt"
        return (f"Prefill. Before any drafting, the target read {read} in one pass ({t.verify_ms:.0f} ms) and "
                f"produced the first token of the answer, {_quote([first])}. This is a one-off cost, not the "
                "cost of a token; the steps after it are the speculative ones.")
    lines = [f"Step {step.index}."]
    drafts = tree.num_drafts
    ended = n_commit < step.accepted_len + 1  # a stop token cut the step short
    own = step.committed[-1].text if step.committed and not ended else ""
    pruned = max(0, step.proposed - len(tree))
    if drafts == 0:
        if step.draft_paused:
            lines.append(
                "Drafting is paused: lately the drafts cost more time than they saved, so the adaptive budget "
                "skips the drafter for a few steps (it tries again after each pause), and"
            )
        elif pruned:
            lines.append(
                f"The drafter offered {_plural(pruned, 'token')}, but the adaptive budget judged that checking "
                "them would cost more time than they were likely to save, so"
            )
        else:
            lines.append("The drafter had nothing to offer (no earlier text matched), so")
        lines.append(f"the target produced one token the ordinary way, {_quote([own])} ({t.verify_ms:.1f} ms).")
        return " ".join(lines)
    who = f"The {method} drafter" if method and method != "none" else "The drafter"
    if step.block:
        lines.append(_block_drafted(step, who))
    else:
        shape = "a chain" if tree.is_chain else "a tree"
        lines.append(
            f"{who} proposed {shape} of {_plural(drafts, 'token')} over {_plural(tree.max_depth, 'level')} "
            f"in {t.draft_ms:.1f} ms."
        )
    source = draft_source(method, tree)
    if source:
        lines.append(source[0].upper() + source[1:])
    if pruned:
        lines.append(f"The adaptive budget dropped {_plural(pruned, 'less likely token')} before checking.")
    lines.append(f"The target checked all of them in one forward pass ({t.verify_ms:.1f} ms).")
    accepted = [step.tree_text[i] for i in step.accepted if i < len(step.tree_text)]
    if accepted:
        lines.append(f"It accepted {_plural(len(accepted), 'drafted token')}, {_quote(accepted)},")
    else:
        lines.append("It accepted none of the drafted tokens,")
    rejected = [visible(step.tree_text[i]) for i in step.rejected if i < len(step.tree_text)]
    if ended:
        lines.append("and then the answer ended.")
        lines.append("It ended at a stop token or the length limit, so only the tokens before that were kept.")
    elif rejected:
        lines.append(
            f"refused {', '.join('‹' + r + '›' for r in rejected)} at the next position, "
            f"and put its own token {_quote([own])} there instead (a correction{_ranked(step)})."
        )
    else:
        lines.append(f"and, the drafts having run out, added its own next token {_quote([own])} for free "
                     "(the bonus token).")
    if step.block:
        lines.append(_block_outcome(step))
    lines.append(
        f"Result: {_plural(n_commit, 'token')} for one target forward"
        + (f"; tau so far {step.stats.tau:.2f}." if step.stats.steps else ".")
    )
    return " ".join(lines)


def _block_drafted(step: Step, who: str) -> str:
    """How a block drafter's step began: every position filled in one forward (and the tree grown
    from the positions' candidates, where it is one)."""
    n, tree = len(step.block), step.tree
    ms = f"{step.timing.draft_ms:.1f} ms"
    if not tree.is_chain:
        return (f"{who} filled a block of {_plural(n, 'position')} in one pass and grew a tree of "
                f"{_plural(tree.num_drafts, 'token')} from each position's best guesses ({ms}).")
    return f"{who} filled a block of {_plural(n, 'guess', 'guesses')} in one pass ({ms}): every position at once."


def _block_outcome(step: Step) -> str:
    """What this block shows: how many of its guesses the target kept, and how the drafter's
    confidence fell along it (each position guessed blind to the ones before it)."""
    n, kept = len(step.block), step.accepted_len
    if kept == 0:
        head = f"This block: {_plural(n, 'guess', 'guesses')} in one pass, none accepted."
    elif kept == n:
        head = f"This block: {_plural(n, 'guess', 'guesses')} in one pass, every one accepted."
    else:
        first = "only the first" if kept == 1 else f"the first {kept}"
        head = f"This block: {_plural(n, 'guess', 'guesses')} in one pass, {first} accepted."
    best = [row[0].prob for row in step.block if row]
    if len(best) > 1 and best[-1] < best[0]:
        head += (f" Its confidence went from {best[0]:.2f} at position 1 to {best[-1]:.2f} at position "
                 f"{len(best)}.")
    return head


def _ranked(step: Step) -> str:
    """``; the drafter's guess 2 there, 0.30`` where the target's token was among the block's
    candidates at the refused position."""
    kept = step.accepted_len
    if not step.block or kept >= len(step.block):
        return ""
    rank = next((r for r, c in enumerate(step.block[kept]) if c.id == step.bonus), None)
    if rank is None:
        return ""
    cand = step.block[kept][rank]
    return f"; it was the drafter's guess {rank + 1} there, {cand.prob:.2f}"


HELP_MARKDOWN = """\
# How speculative decoding works

A big **target** model writes one token per forward pass, and each pass costs about the same
whether it checks one token or a dozen. Speculative decoding uses that: a cheap **drafter**
guesses ahead, and the target checks all the guesses at once.

**Draft** — the drafter (an n-gram lookup, an EAGLE head or a small model) proposes a *tree* of
candidate continuations. Node 0 is the root: the last token already produced.

**Verify** — the target runs *one* forward pass over every node of the tree. A tree attention
mask lets each node see only its own ancestors, so every branch is checked at once.

**Accept** — walking down from the root, a drafted token is kept while it is what the target
would have produced there (greedy), or passes a rejection-sampling test (sampling). The kept
tokens form the *accepted path*; in the tree panel it is highlighted and marked ✓. Drafts the
target refused at the next position are marked ✗; deeper nodes were never reached.

**Bonus or correction** — after the accepted path the target's own prediction is free (it came
out of the same forward pass), so every step adds at least one token. Where the target refused the
drafts at that position its token is a **correction**; where every draft on the path was accepted
and the drafts ran out it is a **bonus**. Both are marked ★ in the tree.

**Probabilities** — EAGLE, Medusa and standalone drafters give each draft a probability (how sure
the drafter was), shown beside it in the tree. N-gram drafts are copied from earlier text where the
last few tokens matched, so they have none and the tree shows no numbers for them.

**Medusa vs EAGLE** — Medusa puts independent heads on the target's last hidden state, one per
future position (head 1 guesses the next token, head 2 the one after, ...); all run at once, and
the draft tree is the product of their top-k candidates, best first. That is cheap, but no head
sees the tokens before the position it guesses, so the deeper heads miss more often. EAGLE's head
runs autoregressively, feeding each guess back in, so its deep guesses know the path above them.
Compare them on your own prompt: `compare medusa,eagle3` in the palette (or
`specchat run --compare medusa,eagle3`), then F3; the table under the panes shows the accepted
share at each depth for both.

**Block drafting** — a block drafter fills every position after the root in *one* forward pass:
a few layers that read the target's own hidden states guess position 1, 2, 3... all at once. One
pass for the whole block is what makes it cheap, and also why its later guesses land less often:
each position is guessed without seeing the guesses before it. The tree panel then shows the
block position by position, each with its best candidates and their probabilities; a tree grown
from those candidates is drawn above them.

**Prefill** — before the first step the target reads the whole prompt in one pass (in chunks for a
long prompt; Esc stops it). That one-off cost produces the first token and is shown as its own step.

**In the stream** accepted drafts are underlined, the target's own tokens are bold, and refused
drafts (F5 shows them) are struck through.

**tau** — the mean number of tokens each target forward produces (accepted drafts + the
target's own token).
Baseline decoding has tau = 1. Speed-up is roughly tau times (target forward time) divided by
(draft time + verify time); the compare screen measures it for real.

## The three tree knobs (SGLang names)

* **num_steps** — how many levels deep the drafter guesses (tree depth).
* **eagle_topk** — how many candidates it keeps at each node (branching).
* **num_draft_tokens** — how many nodes the tree may hold in total, root included (the
  target verifies this many tokens per step).

Deeper and wider trees accept more tokens per step but make drafting and verifying costlier.
Change them live in the settings panel or the command palette (e.g. `num_steps 3`); the change
applies at the next step boundary and shows as *pending* until then.
"""
