"""From a command's options to :func:`engine.preflight.check_files`: every command that loads a model
checks its files right after parsing, before the target is read.

Why here, called once by the command line's dispatch: ``run`` (and each of ``serve``'s browser
sessions), ``generate``, ``bench``, ``tune`` and ``train-draft`` all load a target; a mistake in a
file they name (a draft head of another model's width, a pickle without ``--allow-pickle``, a
missing corpus, a damaged config.json or GGUF, ``--settings`` that do not parse) is refused in
one line within a second, instead of after the loading screen.
"""

from __future__ import annotations

import sys

from specchat.command_options import (
    BenchOptions,
    CommandOptions,
    GenerateOptions,
    Options,
    RunOptions,
    TrainDraftOptions,
    TuneOptions,
)
from specchat.options import ALGORITHMS, UsageError, draft_options, given_knobs, make_config


def check_files(options: Options) -> None:
    """Refuse, in one line (a UserError), what is wrong with the files ``options`` name."""
    if isinstance(options, TrainDraftOptions):
        _check_device(options.device)
        return  # its own flags are checked first (train_draft.check_args calls check_train_target)
    if not isinstance(options, CommandOptions) or not options.loads_target():
        return
    _check_device(options.target.device)
    from engine.preflight import check_files as check

    config = make_config(options.spec)  # --settings FILE parses (and its values fit) or is refused here
    drafts = draft_options(options)
    target = options.target
    _check_draft_used(options, config.method, drafts)
    # a length the user gave (a command's own default is its business) against the config's context
    given = "max_new_tokens" in given_knobs(options.spec)
    notes: dict[str, None] = {}  # one warning line each, however many methods read the draft
    for method in _methods(options, config.method):
        target_config = check(target.model, backend=target.backend or "auto", method=method,
                              draft=drafts["draft"], draft_revision=drafts["draft_revision"],
                              token_map=drafts["token_map"], ngram_corpus=drafts["ngram_corpus"],
                              allow_pickle=target.allow_pickle, method_from_draft=drafts["method_from_draft"],
                              answer=config if given else None, warn=lambda line: notes.setdefault(line))
    for line in notes:
        print(f"specchat: warning: {line}", file=sys.stderr)
    if isinstance(options, GenerateOptions):  # a prompt file too big for the context, from its size alone
        from specchat.generate import check_prompt_file_size

        check_prompt_file_size(options, target_config.max_position_embeddings if target_config else None)


def _methods(options: CommandOptions, method: str) -> list[str]:
    """The methods the command runs: the one in force, and bench's ``--methods`` list (a name that
    is no method is left to bench's own words; tune skips a method it cannot run, with the reason)."""
    if not isinstance(options, BenchOptions):
        return [method]
    return list(dict.fromkeys([method, *_listed(options)]))


def _check_draft_used(options: CommandOptions, method: str, drafts: dict) -> None:
    """A ``--draft`` none of the command's methods runs is refused: ``generate --method ngram`` (or a
    bench or tune whose methods take no draft) would load it and never draft with it. ``run`` and
    ``serve`` keep it: the chat's F2 can switch to the draft's method; a draft without a method
    picks its own."""
    from engine.methods import draft_methods

    if not drafts["draft"] or drafts["method_from_draft"] or isinstance(options, RunOptions):
        return
    if isinstance(options, BenchOptions) and options.other_benchmark() not in (None, "--tui"):
        return  # bench's other modes time no method
    methods = [method, *_listed(options)] if options.times_methods else [method]
    if any(m in draft_methods() for m in methods):
        return
    fix = "add one of them to --methods" if options.times_methods else "pick a method that uses it"
    raise UsageError(f"--draft is for {'/'.join(draft_methods())}; drop it or {fix}")


def _listed(options: CommandOptions) -> list[str]:
    """bench's or tune's ``--methods`` as method names (a name that is no method is left to their own words)."""
    default = "ngram" if isinstance(options, TuneOptions) else "none,ngram"
    listed = [n.strip().lower() for n in (getattr(options, "methods", None) or default).split(",")]
    return [ALGORITHMS[n] for n in listed if n in ALGORITHMS]


def _check_device(device: str | None) -> None:
    """--device nope, or cuda without a GPU, before any file is read."""
    if device:
        from engine.loader import pick_device

        pick_device(device)


def check_train_target(options: TrainDraftOptions) -> None:
    """train-draft: the target's config, and enough layers for a draft that reads EAGLE-3's layers
    (its registration's features are "layers": an EAGLE-3 head, a block drafter)."""
    from engine import methods

    spec = methods.get(options.method)
    if spec is not None and spec.features == "layers":
        check_capture_layers(options.model, "an EAGLE-3 head" if options.method == "eagle3" else
                             f"a --method {options.method} drafter (it reads EAGLE-3's layers)")
    else:
        from engine.preflight import target_config

        target_config(options.model)


def check_capture_layers(model: str | None, reader: str = "an EAGLE-3 head") -> None:
    """The target's config from its files, deep enough for ``reader`` to capture its layers
    (train-draft, bench's data engine): refused in one line before the target loads."""
    from engine.preflight import target_config

    config = target_config(model)
    if config is not None:
        from engine.train.eagle3_head import default_aux_layer_ids

        default_aux_layer_ids(config.num_layers, reader)
