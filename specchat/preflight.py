"""From parsed flags to :func:`engine.preflight.check_files`: every command that loads a model
checks its files right after parsing, before the target is read.

Why here, called once by the command line's dispatch: ``run`` (and each of ``serve``'s browser
sessions), ``generate``, ``bench``, ``tune`` and ``train-draft`` all load a target; a mistake in a
file they name (a draft head of another model's width, a pickle without ``--allow-pickle``, a
missing corpus, a damaged config.json or GGUF, ``--settings`` that do not parse) is refused in
one line within a second, instead of after the loading screen.
"""

from __future__ import annotations

import argparse

from specchat.options import ALGORITHMS, draft_options, make_config

# the commands whose target loads from the flags read here (export and replay load none)
LOADING = ("run", "serve", "generate", "bench", "tune", "train-draft")


def check_files(args: argparse.Namespace) -> None:
    """Refuse, in one line (a UserError), what is wrong with the files ``args`` names."""
    command = getattr(args, "command", None)
    if command not in LOADING or getattr(args, "fake", False) or getattr(args, "random_weights", None):
        return
    if getattr(args, "device", None):
        from engine.loader import pick_device

        pick_device(args.device)  # --device nope or cuda without a GPU, before any file is read
    if command == "train-draft":
        return  # its own flags are checked first (train_draft.check_args calls check_train_target)
    from engine.preflight import check_files as check

    config = make_config(args)  # --settings FILE parses (and its values fit) or is refused here
    options = draft_options(args)
    for method in _methods(args, config.method):
        check(args.model, backend=getattr(args, "backend", None) or "auto", method=method,
              draft=options["draft"], draft_revision=options["draft_revision"], token_map=options["token_map"],
              ngram_corpus=options["ngram_corpus"], allow_pickle=bool(getattr(args, "allow_pickle", False)),
              method_from_draft=options["method_from_draft"])


def _methods(args: argparse.Namespace, method: str) -> list[str]:
    """The methods the command runs: the one in force, and bench's ``--methods`` list (a name that
    is no method is left to bench's own words; tune skips a method it cannot run, with the reason)."""
    if args.command != "bench":
        return [method]
    listed = [n.strip().lower() for n in (getattr(args, "methods", None) or "").split(",")]
    return list(dict.fromkeys([method, *(ALGORITHMS[n] for n in listed if n in ALGORITHMS)]))


def check_train_target(args: argparse.Namespace) -> None:
    """train-draft: the target's config, and enough layers for an EAGLE-3 head."""
    from engine.preflight import target_config

    config = target_config(args.model)
    if config is not None and getattr(args, "method", "eagle3") == "eagle3":
        from engine.train.head import default_aux_layer_ids

        default_aux_layer_ids(config.num_layers)
