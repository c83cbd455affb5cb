"""Entry points the CLI calls (lazily): ``run_tui(options)`` and ``replay_tui(options)``.

Textual is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config import ConfigError, SpecConfig
from engine.errors import UserError

if TYPE_CHECKING:
    from specchat.command_options import CommandOptions, ReplayOptions, RunOptions

# the method used when the user names none (the loader may know better; see the report to issue 3)
DEFAULT_METHOD = "ngram"
# guesses per position the app shows of a block drafted in one pass (the tree panel, teaching mode)
BLOCK_CANDIDATES = 3


def config_from_args(options: RunOptions, default_method: str | None = DEFAULT_METHOD) -> SpecConfig:
    """The SpecConfig for ``specchat run``: the mapping every command uses (``specchat.options``).

    So the TUI applies the same rules as ``generate`` and ``bench`` (method aliases, SGLang's
    top-k 1 rule, a draft implying the method). Raises ConfigError (one line) when the flags are
    invalid, an unknown method included.
    """
    from specchat.options import UsageError, make_config

    defaults = {"method": default_method} if default_method is not None else {}
    try:
        return make_config(options.spec, **defaults)
    except UsageError as exc:
        raise ConfigError(str(exc)) from None


def _ui_settings(theme: str | None, compare: str | None = None):
    """The UI settings of the config file, with ``--theme`` and ``--compare A,B`` over them."""
    from specchat.tui.compare_pair import parse_pair
    from specchat.tui.userconfig import load_ui_settings

    ui, warnings = load_ui_settings()
    if theme:
        ui = ui.replace(theme=theme)
    try:
        ui = ui.replace(compare=parse_pair(ui.compare))
    except ConfigError as exc:
        warnings.append(f"config file: {exc}; comparing the baseline with the method in force")
        ui = ui.replace(compare="")
    if compare:  # --compare A,B (preflight checked it; the session's methods later)
        ui = ui.replace(compare=parse_pair(compare))
    return ui, warnings


@dataclass(frozen=True)
class SessionLoader:
    """Loads the session for the TUI; a plain picklable object, since it runs in the engine's process."""

    model: str | None
    config: SpecConfig
    dtype: str
    device: str
    options: dict[str, Any]

    def __call__(self, progress):
        from engine.loader import load_session  # imported where the model lives

        session = load_session(self.model, self.config, progress=progress, dtype=self.dtype, device=self.device,
                               **self.options)
        session.report_blocks(BLOCK_CANDIDATES)  # the app shows a block's every position; bench never pays for it
        return session


def session_loader(options: CommandOptions, config: SpecConfig) -> SessionLoader:
    """The chat's loader for a command's flags (``run``; ``bench --tui`` starts the chat as run does)."""
    # the loader options beyond the documented four. The engine gets every core, as in
    # `generate`/`bench`: it runs in its own process and the UI yields the CPU to it (engine_process.py).
    target = options.target
    passed = {"backend": target.backend, "allow_pickle": target.allow_pickle, "threads": target.threads,
              "revision": target.revision, "weights": target.weights, "precision": target.precision}
    extra = {k: v for k, v in passed.items() if v is not None}
    extra["reserve_cores"] = 0
    from specchat.options import draft_options

    extra.update(draft_options(options))
    # every head shipped for the model is loaded beside the one in force (its load time was within the
    # noise of loading one; the Medusa heads are ~12 MB), so the settings and the palette can switch
    # to any of those methods while chatting
    from engine.drafters.draft_loader import shipped_methods

    extra["also"] = tuple(dict.fromkeys((*extra["also"], *shipped_methods())))
    return SessionLoader(target.model, config, target.dtype or "auto", target.device or "auto", extra)


def _fake_factory(config: SpecConfig):
    """A scripted session with demo answers at realistic speed (``--fake``: UI demos without a model)."""
    from specchat.tui.scripted import ScriptedLoader

    return ScriptedLoader(config, step_delay=None, time_scale=1.0)


def preflight(options: RunOptions) -> tuple[SpecConfig, str]:
    """The config and the precision ``specchat run`` will use, checked before any app starts.

    Why a function: ``specchat serve`` refuses the same bad flags once, in one line, before its
    server starts, instead of each browser session failing on its own. Raises a UserError
    (ConfigError, LoadError) whose message is that line.
    """
    config = config_from_args(options)
    if options.record:
        from specchat.tui.trace import check_record_path

        check_record_path(options.record, force=options.force)
    if options.compare is not None:  # --compare A,B: known methods, two different ones
        from specchat.tui.compare_pair import parse_pair

        parse_pair(options.compare)
    if options.fake:
        return config, "exact"
    from engine.loader import pick_device, pick_dtype, resolve_precision

    # a precision this machine cannot run is a one-line refusal
    target = options.target
    device = pick_device(target.device or "auto")
    precision = resolve_precision(target.precision or "auto", device=device,
                                  dtype=pick_dtype(target.dtype or "auto", device),
                                  weights=target.weights or "stored", backend=target.backend or "auto")
    return config, precision


def run_tui(options: RunOptions) -> int:
    try:
        config, precision = preflight(options)
    except UserError as exc:
        print(f"specchat run: {exc}", file=sys.stderr)
        return 2
    ui, warnings = _ui_settings(options.theme, options.compare)
    fake = options.fake
    if fake:
        factory = _fake_factory(config)
    else:  # the engine loads the precision resolved here, the one the app shows
        target = dataclasses.replace(options.target, precision=precision)
        factory = session_loader(dataclasses.replace(options, target=target), config)

    from specchat.options import given_knobs
    from specchat.tui.app import SpecChatApp

    model = options.target.model
    app = SpecChatApp(
        factory=factory,
        config=config,
        ui=ui,
        warnings=warnings,
        start_in="compare" if options.compare is not None else "chat",
        teach=options.teach,
        record=options.record,
        model_label="fake-model" if fake else (model or "embedded model"),
        precision=precision,
        draft_model=options.spec.draft or "",
        serve_model="" if fake else (model or ""),
        engine_process=os.environ.get("SPECCHAT_ENGINE_PROCESS", "1") != "0",
        given=given_knobs(options.spec),
    )
    result = app.run()
    if app.load_error:
        print(f"specchat run: could not load the model: {app.load_error}", file=sys.stderr)
        return 1
    return int(result or 0)


def replay_tui(options: ReplayOptions) -> int:
    from specchat.tui.trace import TraceError, open_trace

    path = str(options.trace)
    try:  # a recording cut by a crash still plays up to its last whole record
        trace = open_trace(path, tolerant=True)
    except TraceError as exc:
        print(f"specchat replay: {exc}", file=sys.stderr)
        return 2
    speed = options.speed  # the parser keeps it above 0
    try:
        config = SpecConfig.from_dict(trace.header.get("config") or {})
    except (ConfigError, TypeError):
        config = SpecConfig()
    ui, warnings = _ui_settings(options.theme)
    if trace.dropped:
        warnings = [*warnings, f"{path}: {trace.dropped} damaged line(s) left out (the recording was cut); "
                               "replaying the rest"]

    from specchat.tui.app import SpecChatApp
    from specchat.tui.trace import ReplaySource

    app = SpecChatApp(
        factory=None,
        config=config,
        ui=ui,
        warnings=warnings,
        replay=ReplaySource(path, trace.header, tuple(trace.records), speed=speed,
                            step=options.step),
        model_label=str(trace.header.get("model") or ""),
    )
    result = app.run()
    return int(result or 0)
