"""Write random EAGLE-1/2 and EAGLE-3 heads and a random standalone draft that fit a model.

Random drafts are almost never right, so they measure the drafting machinery (its cost, the
tree shapes, exactness against the baseline), not a speed-up. Usage:

    .venv/bin/python scripts/random_drafts.py smollm2-135m /tmp/drafts
    .venv/bin/specchat bench --draft /tmp/drafts/eagle3 --methods none,eagle3 --prompts ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> int:
    from heads import write_random_drafts

    from engine.models.resolve import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="model name, folder or hub id (its config and tokenizer are used)")
    parser.add_argument("out", help="folder to write eagle/, eagle3/ and standalone/ into")
    parser.add_argument("--draft-vocab", type=int, default=8192, help="EAGLE-3 draft vocabulary size")
    args = parser.parse_args()
    model_dir = resolve_model(args.model).path
    for kind, path in write_random_drafts(Path(model_dir), Path(args.out), draft_vocab=args.draft_vocab).items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
