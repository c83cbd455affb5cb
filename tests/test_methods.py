"""The method registry is the one place a method is declared (engine/methods.py).

Like the knobs' agreement test: every surface that lists methods agrees with the registrations,
no product file keeps its own list of method names (outside a short list, each entry explained),
and a method registered anew shows up in the CLI, export, the settings, teaching and the palette
without another file changing.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from engine import methods
from engine.config import METHOD_KNOBS, Method, SpecConfig, knobs_for
from engine.knobs import KNOBS, METHODS, SGLANG_ALGORITHMS
from engine.method_spec import TREE_KNOBS, resolve

ROOT = Path(__file__).resolve().parents[1]
# "none" is left out: it is also a plain word (--ngram-corpus none)
NAMES = ("ngram", "eagle", "eagle3", "standalone", "medusa", "dflash")

# Where a method's name may still be written out, outside the method's own files (the files whose
# name starts with it, engine/drafters/medusa*.py, engine/train/eagle3_head.py..., and those in a
# folder of its name, engine/drafters/dflash/). Each says why.
ALLOWED: dict[str, tuple[set[str], str]] = {
    "engine/config.py": ({"ngram", "eagle", "eagle3", "standalone", "medusa", "dflash"},
                         "the Method Literal, a typing aid tied to the registry below"),
    "engine/drafters/draft_loader.py": ({"eagle", "eagle3", "standalone", "medusa"},
                                        "telling the checkpoint formats apart: which kind a draft's files are"),
    "engine/preflight.py": ({"standalone"}, "a standalone draft's tokenizer and size, checked from its files"),
    "engine/loader.py": ({"ngram"}, "the n-gram corpus's cache folder name, <cache>/ngram"),
    "specchat/cli.py": ({"ngram"}, "tune's default --methods"),
    "specchat/generate.py": ({"ngram"}, "the command's default method"),
    "specchat/export.py": ({"ngram"}, "export's default method (run's)"),
    "specchat/preflight.py": ({"ngram", "eagle3"}, "bench/tune's default --methods; train-draft's EAGLE-3 layer check"),
    "specchat/tui/launch.py": ({"ngram"}, "the app's default method"),
    "specchat/tui/scripted.py": ({"ngram"}, "the scripted fake engine's default method"),
    "specchat/tui/headless.py": ({"eagle3"}, "the headless demo's fixed settings"),
    "specchat/tui/widgets/title_bar.py": ({"ngram"}, "the title's n-gram summary (its match window)"),
    "specchat/gpu_bench.py": ({"eagle", "eagle3"}, "--random-weights builds and times EAGLE-3 heads"),
    "specchat/train_draft.py": ({"eagle3", "medusa", "dflash"}, "train-draft's kinds (the trainers are per kind)"),
    "specchat/train_medusa.py": ({"medusa"}, "the Medusa trainer's card"),
}


def _owner(path: str) -> str | None:
    """The method whose own file ``path`` is (in a folder of its name, or its name starts with the
    method's), else None."""
    folders = set(Path(path).parts[:-1])
    stem = Path(path).stem
    return next((n for n in sorted(NAMES, key=len, reverse=True) if n in folders or stem.startswith(n)), None)


def _literals() -> dict[str, set[str]]:
    """Product file -> the method names written in it as a whole string literal."""
    found: dict[str, set[str]] = {}
    for package in ("engine", "specchat"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in NAMES:
                    found.setdefault(rel, set()).add(node.value)
    return found


def test_no_product_file_lists_methods_outside_the_registrations() -> None:
    stray = {}
    for path, names in _literals().items():
        owner = _owner(path)
        # a method's own files may name it (and EAGLE's files both EAGLE kinds)
        own = {n for n in names if owner and n.startswith(owner.rstrip("3"))}
        left = names - own - ALLOWED.get(path, (set(), ""))[0]
        if left:
            stray[path] = sorted(left)
    assert not stray, f"method names written outside their registrations: {stray} (declare them in " \
                      "engine/drafters/<method>_method.py, or explain the file in ALLOWED)"
    unused = {p for p, (names, _) in ALLOWED.items() if not names & _literals().get(p, set())}
    assert not unused, f"ALLOWED entries no longer needed: {sorted(unused)}"


# the product files outside engine/drafters/dflash/ that may say "dflash" at all (issue 56 asks for at most
# three): the registry lists its registration, the Method Literal names it, train-draft offers its trainer
# (engine/drafters/dflash/train.py) as one of its kinds
DFLASH_OUTSIDE = {"engine/methods.py", "engine/config.py", "specchat/train_draft.py"}


def test_dflash_is_one_folder_and_two_lines_elsewhere() -> None:
    """A method added after the registry: its folder, the registry's import and the Literal, nothing
    more (its docs aside)."""
    found = set()
    for package in ("engine", "specchat"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith("engine/drafters/dflash/") and "dflash" in path.read_text(encoding="utf-8").lower():
                found.add(rel)
    assert found == DFLASH_OUTSIDE and len(found) <= 3


def test_every_surface_agrees_with_the_registry() -> None:
    from specchat.export import launch_line
    from specchat.options import ALGORITHMS, TREE_METHODS
    from specchat.tui.teaching import draft_source

    names = methods.names()
    assert names[0] == "none" and len(set(names)) == len(names)
    assert set(typing.get_args(Method)) == set(names)  # the Literal is a typing aid only
    assert METHODS == names == KNOBS["method"].choices == tuple(METHOD_KNOBS)
    assert {**{n: n for n in names}, "eagle2": "eagle"} == ALGORITHMS
    assert tuple(m.name for m in methods.all_methods() if m.tree) == TREE_METHODS
    assert {m.name: m.sglang for m in methods.all_methods() if m.sglang} == SGLANG_ALGORITHMS
    for m in methods.all_methods():
        assert set(m.knobs) <= set(KNOBS), m.name
        assert knobs_for(m.name) == ((*m.knobs, "adaptive_draft") if m.knobs else ())
        assert not m.tree or set(TREE_KNOBS) <= set(m.knobs), m.name
        assert bool(m.drafter) != m.takes_draft, f"{m.name}: a drafter class or a draft to load, not both"
        if m.drafter:
            assert resolve(m.drafter)().name == m.name
        if m.draft is not None:
            assert callable(resolve(m.draft.load)), m.name
        assert m.name == "none" or draft_source(m.name) == m.teaching != ""
        if m.name != "none":
            vllm = launch_line("vllm", SpecConfig(method=m.name), None, "d").command
            assert (f'"method": "{m.vllm}"' in vllm) == (m.vllm is not None), m.name


def test_the_chain_rule_is_one_function() -> None:
    from specchat.options import make_config
    from tests.parsed import parsed

    assert methods.chain_size(5) == 6
    for m in methods.tree_methods():
        config = make_config(parsed("export", "sglang", "--method", m, "--speculative-eagle-topk", "1",
                                    "--speculative-num-steps", "3").spec)
        assert config.num_draft_tokens == methods.chain_size(3) and config.tree_width == 1


def test_a_name_cannot_be_registered_twice() -> None:
    with pytest.raises(ValueError, match="registered already"):
        methods.register(methods.MethodSpec("fresh", aliases=("eagle2",)))


FAKE = """
import json
from engine import methods
from engine.method_spec import TREE_KNOBS, DraftSpec, MethodSpec

methods.register(MethodSpec("blockdraft", teaching="Block drafts come from one pass.", aliases=("block",),
                            knobs=TREE_KNOBS, tree=True, features="layers", draft=DraftSpec("engine.x:load"),
                            sglang="BLOCK", vllm="block", llamacpp="draft-block"))

from specchat.cli import build_parser
from specchat.command_options import options_for
from specchat.export import launch_line
from specchat.options import make_config
from specchat.tui.settings_schema import FIELDS, parse_value, why_not
from specchat.tui.teaching import draft_source

parser = build_parser()
options = options_for(parser.parse_args(["export", "sglang", "--method", "BLOCK", "--draft", "d",
                                         "--speculative-eagle-topk", "1", "--speculative-num-steps", "3"]))
config = make_config(options.spec)
help_text = next(a.help for a in parser._subparsers._group_actions[0].choices["run"]._actions
                 if a.dest == "method")
print(json.dumps({
    "method": config.method, "chain": config.num_draft_tokens,
    "sglang": launch_line("sglang", config, None, "d").command,
    "vllm": launch_line("vllm", config, None, "d").command,
    "help": help_text,
    "panel": list(FIELDS["method"].choices), "palette": parse_value(FIELDS["method"], "blockdraft"),
    "why_not": why_not("medusa_tree", "blockdraft"),
    "teaching": draft_source("blockdraft"),
}))
"""


def test_a_new_registration_shows_up_everywhere_without_touching_another_file() -> None:
    """A method registered before the app starts (what a new method's module does): the CLI takes
    it (and its alias, any case), SGLang's top-k 1 rule applies, export writes its server names,
    the settings panel and the palette offer it, teaching explains it."""
    out = subprocess.run([sys.executable, "-c", FAKE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["method"] == "blockdraft" and got["chain"] == 4
    assert "--speculative-algorithm BLOCK" in got["sglang"] and "--speculative-draft-model-path d" in got["sglang"]
    assert '"method": "block"' in got["vllm"]
    assert "medusa, dflash or blockdraft (block)" in got["help"]
    assert got["panel"][-1] == "blockdraft" and got["palette"] == "blockdraft"
    assert got["why_not"] == "not used by blockdraft; acts on medusa"
    assert got["teaching"] == "Block drafts come from one pass."


# a method with a draft format of its own, for the test below (named by "module:function" as a
# registration names its own)
def _claims(config: dict) -> bool:
    return bool(config.get("block_drafter"))


def _read(config: dict, state: dict, target_config, label: str) -> tuple:
    from engine.drafters.eagle_checkpoint import DraftLoadError

    if config["hidden_size"] != target_config.hidden_size:
        raise DraftLoadError(f"{label} is {config['hidden_size']} wide; the target is {target_config.hidden_size}")
    return (sorted(state),)


def _load(found, target, tokenizer):
    from engine.drafters.base import NoDrafter
    from engine.drafters.draft_loader import DraftBundle

    return DraftBundle(found.kind, NoDrafter, None, f"block draft {found.label} ({', '.join(found.parts[0])})")


def test_a_new_draft_format_is_read_by_its_own_registration(tmp_path) -> None:
    """A registration that claims its drafts' config.json: check_draft and load_draft hand its files
    to its own reader and loader (draft_loader untouched); another method's flag is refused."""
    import torch
    from safetensors.torch import save_file
    from test_eagle import target

    from engine.drafters.draft_loader import DraftLoadError, check_draft, load_draft
    from engine.method_spec import DraftSpec

    model = target()
    folder = tmp_path / "block"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"block_drafter": True, "hidden_size": model.config.hidden_size}))
    save_file({"proj.weight": torch.zeros(2, 2)}, str(folder / "model.safetensors"))
    here = "tests.test_methods"
    spec = methods.MethodSpec("blockdraft", draft=DraftSpec(f"{here}:_load", claims=f"{here}:_claims",
                                                            read=f"{here}:_read"))
    with methods.registered(spec):
        assert check_draft(str(folder), model.config)[0] == "blockdraft"
        bundle = load_draft(str(folder), model, None, method="blockdraft")
        assert bundle.method == "blockdraft" and bundle.description == "block draft block (proj.weight)"
        with pytest.raises(DraftLoadError, match="holds a blockdraft draft, not an eagle3 draft"):
            check_draft(str(folder), model.config, method="eagle3")
        (folder / "config.json").write_text(json.dumps({"block_drafter": True, "hidden_size": 3}))
        with pytest.raises(DraftLoadError, match="is 3 wide"):
            check_draft(str(folder), model.config)
    assert methods.get("blockdraft") is None
