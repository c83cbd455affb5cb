"""Which of our model classes runs a config.json: the one place that knows every family.

Why apart: the loader, the GGUF reader's messages and the tests all ask "do we run this, and with
what"; answering from one table keeps the families named in error messages the families we run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.models.gemma3 import GEMMA3_TYPES, Gemma3Config, Gemma3Model
from engine.models.llama import LlamaModel
from engine.models.llama_config import SUPPORTED_TYPES, LlamaConfig, UnsupportedModelError

RUN_TYPES = (*SUPPORTED_TYPES, *GEMMA3_TYPES)


def model_for_config(raw: Mapping[str, Any]) -> tuple[LlamaConfig, type[LlamaModel]]:
    """(parsed config, model class) for a config.json dict; UnsupportedModelError (one line, with
    the ``--backend hf`` hint) for a family we do not run."""
    model_type = str(raw.get("model_type", "")).lower()
    if model_type in GEMMA3_TYPES:
        return Gemma3Config.from_dict(raw), Gemma3Model
    if model_type in SUPPORTED_TYPES:
        return LlamaConfig.from_dict(raw), LlamaModel
    archs = ", ".join(raw.get("architectures") or []) or model_type or "unknown"
    raise UnsupportedModelError(
        f"model type {archs!r} is not one specchat's own forward runs ({', '.join(RUN_TYPES)}); "
        "use --backend hf to run it through transformers"
    )
