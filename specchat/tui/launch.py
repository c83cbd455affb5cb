"""Entry points the CLI calls (lazily): ``run_tui(args)`` and ``replay_tui(args)``.

Textual is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

from engine.config import ConfigError, SpecConfig
from engine.errors import UserError

# the method used when the user names none (the loader may know better; see the report to issue 3)
DEFAULT_METHOD = "ngram"


def config_from_args(args: argparse.Namespace, default_method: str | None = DEFAULT_METHOD) -> SpecConfig:
    """The SpecConfig for ``specchat run``: the mapping every command uses (``specchat.options``).

    So the TUI applies the same rules as ``generate`` and ``bench`` (method aliases, SGLang's
    top-k 1 rule, a draft implying the method). Missing or None flags are skipped. Raises
    ConfigError (one line) when the flags are invalid, an unknown method included.
    """
    from specchat.options import UsageError, make_config

    defaults = {"method": default_method} if default_method is not None else {}
    try:
        return make_config(args, **defaults)
    except UsageError as exc:
        raise ConfigError(str(exc)) from None


def _ui_settings(args: argparse.Namespace):
    from specchat.tui.compare_pair import parse_pair
    from specchat.tui.userconfig import load_ui_settings

    ui, warnings = load_ui_settings()
    theme = getattr(args, "theme", None)
    if theme:
        ui = ui.replace(theme=theme)
    try:
        ui = ui.replace(compare=parse_pair(ui.compare))
    except ConfigError as exc:
        warnings.append(f"config file: {exc}; comparing the baseline with the method in force")
        ui = ui.replace(compare="")
    compare = getattr(args, "compare", None)
    if isinstance(compare, str) and compare:  # --compare A,B (preflight checked it; the session's methods later)
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

        return load_session(self.model, self.config, progress=progress, dtype=self.dtype, device=self.device,
                            **self.options)


def _real_factory(args: argparse.Namespace, config: SpecConfig) -> SessionLoader:
    # loader options the CLI may carry beyond the documented four. The engine gets every core, as in
    # `generate`/`bench`: it runs in its own process and the UI yields the CPU to it (engine_process.py).
    passed = ("backend", "allow_pickle", "threads", "revision", "weights", "precision")
    extra = {k: getattr(args, k) for k in passed if getattr(args, k, None) is not None}
    extra["reserve_cores"] = 0
    from specchat.options import draft_options

    extra.update(draft_options(args))
    # every head shipped for the model is loaded beside the one in force (its load time was within the
    # noise of loading one; the Medusa heads are ~12 MB), so the settings and the palette can switch
    # to any of those methods while chatting
    from engine.drafters.draft_loader import SHIPPED_METHODS

    extra["also"] = tuple(dict.fromkeys((*extra["also"], *SHIPPED_METHODS)))
    return SessionLoader(getattr(args, "model", None), config, getattr(args, "dtype", None) or "auto",
                         getattr(args, "device", None) or "auto", extra)


def _fake_factory(config: SpecConfig):
    """A scripted session with demo answers at realistic speed (``--fake``: UI demos without a model)."""
    from specchat.tui.scripted import ScriptedLoader

    return ScriptedLoader(config, step_delay=None, time_scale=1.0)


def preflight(args: argparse.Namespace) -> tuple[SpecConfig, str]:
    """The config and the precision ``specchat run`` will use, checked before any app starts.

    Why a function: ``specchat serve`` refuses the same bad flags once, in one line, before its
    server starts, instead of each browser session failing on its own. Raises a UserError
    (ConfigError, LoadError) whose message is that line.
    """
    config = config_from_args(args)
    if getattr(args, "record", None):
        from specchat.tui.trace import check_record_path

        check_record_path(args.record)
    if isinstance(getattr(args, "compare", None), str):  # --compare A,B: known methods, two different ones
        from specchat.tui.compare_pair import parse_pair

        parse_pair(args.compare)
    if getattr(args, "fake", False):
        return config, "exact"
    from engine.loader import pick_device, pick_dtype, resolve_precision

    # a precision this machine cannot run is a one-line refusal
    device = pick_device(getattr(args, "device", None) or "auto")
    precision = resolve_precision(getattr(args, "precision", None) or "auto", device=device,
                                  dtype=pick_dtype(getattr(args, "dtype", None) or "auto", device),
                                  weights=getattr(args, "weights", None) or "stored",
                                  backend=getattr(args, "backend", None) or "auto")
    return config, precision


def run_tui(args: argparse.Namespace) -> int:
    try:
        config, precision = preflight(args)
    except UserError as exc:
        print(f"specchat run: {exc}", file=sys.stderr)
        return 2
    ui, warnings = _ui_settings(args)
    fake = bool(getattr(args, "fake", False))
    if not fake:
        args.precision = precision
    factory = _fake_factory(config) if fake else _real_factory(args, config)

    from specchat.tui.app import SpecChatApp

    model = getattr(args, "model", None)
    app = SpecChatApp(
        factory=factory,
        config=config,
        ui=ui,
        warnings=warnings,
        start_in="compare" if getattr(args, "compare", None) not in (None, False) else "chat",
        teach=bool(getattr(args, "teach", False)),
        record=getattr(args, "record", None),
        model_label="fake-model" if fake else (model or "embedded model"),
        precision=precision,
        draft_model=getattr(args, "draft", None) or "",
        serve_model="" if fake else (model or ""),
        engine_process=os.environ.get("SPECCHAT_ENGINE_PROCESS", "1") != "0",
    )
    result = app.run()
    if app.load_error:
        print(f"specchat run: could not load the model: {app.load_error}", file=sys.stderr)
        return 1
    return int(result or 0)


def replay_tui(args: argparse.Namespace) -> int:
    from specchat.tui.trace import TraceError, open_trace

    path = str(args.trace)
    try:  # a recording cut by a crash still plays up to its last whole record
        trace = open_trace(path, tolerant=True)
    except TraceError as exc:
        print(f"specchat replay: {exc}", file=sys.stderr)
        return 2
    speed = float(getattr(args, "speed", None) or 1.0)
    if speed <= 0:
        print("specchat replay: --speed must be > 0", file=sys.stderr)
        return 2
    try:
        config = SpecConfig.from_dict(trace.header.get("config") or {})
    except (ConfigError, TypeError):
        config = SpecConfig()
    ui, warnings = _ui_settings(args)
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
                            step=bool(getattr(args, "step", False))),
        model_label=str(trace.header.get("model") or ""),
    )
    result = app.run()
    return int(result or 0)
