"""One line at the top: model, method and tree knobs in force, pending changes, replay state."""

from __future__ import annotations

from typing import ClassVar

from textual.content import Content
from textual.widgets import Static

from engine.config import SpecConfig, method_knobs
from specchat.tui.app_status import AppStatus
from specchat.tui.settings_schema import format_value
from specchat.tui.widgets.repaint import update_static

_TREE_KNOBS = (("num_steps", "steps"), ("eagle_topk", "topk"), ("num_draft_tokens", "tokens"))


def config_summary(cfg: SpecConfig) -> str:
    if cfg.method == "none":
        knobs = "baseline"
    elif cfg.method == "ngram":
        knobs = (f"ngram · window {cfg.ngram_min_match_window_size}-{cfg.ngram_max_match_window_size} "
                 f"· tokens {cfg.num_draft_tokens}")
    else:  # the tree knobs the method reads (a block drafter reads the tree size only)
        reads = method_knobs(cfg.method)
        knobs = " · ".join([cfg.method, *(f"{label} {getattr(cfg, name)}" for name, label in _TREE_KNOBS
                                          if name in reads)])
    # the sampling scheme only where it differs from the default (coupled: the baseline's sample)
    scheme = " rejection" if cfg.sampling == "rejection" else ""
    sampling = "greedy" if cfg.greedy else f"T {cfg.temperature:g} top-p {cfg.top_p:g}{scheme}"
    return f"{knobs} · {sampling}"


def pending_summary(applied: SpecConfig, pending: SpecConfig | None) -> str:
    if pending is None:
        return ""
    a, p = applied.to_dict(), pending.to_dict()
    changed = [f"{k} {format_value(a[k])}→{format_value(p[k])}" for k in p if p[k] != a[k]]
    return ", ".join(changed)


class TitleBar(Static):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"title--pending", "title--replay"}

    def show(self, app_status: AppStatus) -> None:
        """``app_status.precision`` is shown when it is not the exact reference ("fast precision")."""
        # what changes (status, pending, replay state) comes first: a narrow terminal cuts the end
        parts: list[tuple[str, str] | str] = [("specchat", "bold")]
        if app_status.replay:
            parts += [" · ", (app_status.replay, ".title--replay")]
        if app_status.status:
            parts += [" · ", (app_status.status, "italic")]
        pend = pending_summary(app_status.applied, app_status.pending)
        if pend:
            parts += [" · ", ("◌ pending: " + pend, ".title--pending")]
        if app_status.context:
            parts += [" · ", app_status.context]
        if app_status.precision:
            parts += [" · ", (app_status.precision, "bold")]
        parts += [" · ", config_summary(app_status.applied)]
        if app_status.model:
            parts += [" · ", app_status.model]
        update_static(self, Content.assemble(*parts))
