"""The chat app headless on the device (textual's Pilot): load the embedded model, answer one
prompt, and write what happened as JSON. textual and platformdirs are not on the lent machine:
check.sh puts the copies carried in .whl/site on PYTHONPATH (vendor.sh makes them).

    python3 scripts/device/pilot_chat.py --device cuda --json OUT.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path


async def chat(device: str, prompt: str, tokens: int) -> dict:
    from engine.config import SpecConfig
    from engine.loader import load_session
    from specchat.tui.app import SpecChatApp
    from specchat.tui.headless import send, ui_settings, wait_idle, wait_until
    from specchat.tui.widgets.transcript import AnswerView

    config = SpecConfig(method="ngram", max_new_tokens=tokens)
    app = SpecChatApp(factory=lambda progress: load_session(None, config, progress=progress, device=device),
                      config=config, ui=ui_settings())
    start = time.perf_counter()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.loaded or app.loading_screen.has_class("-failed"), timeout=300,
                         what="model load")
        if not app.loaded:
            return {"loaded": False, "error": str(app.loading_screen.query_one("#loading-error").render())}
        loaded = time.perf_counter() - start
        await send(pilot, prompt)
        await wait_idle(pilot)
        answer = app.chat_screen.query(AnswerView).last()
        return {"loaded": True, "load_s": round(loaded, 1), "answer_s": round(time.perf_counter() - start - loaded, 1),
                "reason": answer.finished.reason if answer.finished else None,
                "text": answer.stream.plain_text[:400]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompt", default="Say hello.")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    result = asyncio.run(chat(args.device, args.prompt, args.tokens))
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return 0 if result.get("loaded") and result.get("reason") in ("stop", "length") else 1


if __name__ == "__main__":
    raise SystemExit(main())
