"""Launch lines (specchat/export.py), ``specchat export``, ``--settings FILE`` and the palette's copy.

The promises: the SGLang line uses SGLang's server_args flag names (the n-gram match-window
flags it dropped are left out, and said so); the vLLM line's ``--speculative-config`` is JSON
with exactly vLLM SpeculativeConfig's field names, and says what does not carry over (chains,
not trees); a settings file is read back to the same SpecConfig and refused in one line when
wrong; the palette copies the line of the settings in force.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from engine import methods
from engine.config import SpecConfig
from specchat.cli import main
from specchat.export import EMBEDDED_HUB_ID, SERVERS, launch_line, serving_model
from specchat.options import UsageError, draft_options, load_settings, make_config
from specchat.tui.headless import SIZE, make_app, make_session, wait_loaded, wait_until
from specchat.tui.launch import config_from_args
from tests.parsed import parsed
from tests.tui.helpers import palette

# vllm/config/speculative.py, SpeculativeConfig: the fields our JSON may use
VLLM_FIELDS = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}
SGL = f"python -m sglang.launch_server --model-path {EMBEDDED_HUB_ID}"
TREE = "--speculative-num-steps 4 --speculative-eagle-topk 2 --speculative-num-draft-tokens 6"


def _tree(method: str) -> SpecConfig:
    return SpecConfig(method=method, num_steps=4, eagle_topk=2, num_draft_tokens=6, adaptive_draft=False)


# a DFlash block of 16 (SGLang's --speculative-num-draft-tokens; num_steps does not act on it), verified as
# a chain (top-k 1) or as a DDTree of 16 nodes (top-k 2: specchat's own, no server takes it)
BLOCK = SpecConfig(method="dflash", num_steps=4, eagle_topk=1, num_draft_tokens=16, adaptive_draft=False)
DDTREE = BLOCK.replace(eagle_topk=2)


@pytest.mark.parametrize(("config", "expected"), [
    (SpecConfig(method="ngram", num_draft_tokens=16, ngram_max_bfs_breadth=4, adaptive_draft=False),
     f"{SGL} --speculative-algorithm NGRAM --speculative-num-draft-tokens 16 --speculative-ngram-min-bfs-breadth 1 "
     "--speculative-ngram-max-bfs-breadth 4 --speculative-ngram-match-type BFS --speculative-ngram-max-trie-depth 18"),
    (_tree("eagle3"), f"{SGL} --speculative-draft-model-path my/head --speculative-algorithm EAGLE3 {TREE}"),
    (_tree("eagle"), f"{SGL} --speculative-draft-model-path my/head --speculative-algorithm EAGLE {TREE}"),
    (_tree("standalone"), f"{SGL} --speculative-draft-model-path my/head --speculative-algorithm STANDALONE {TREE}"),
    (BLOCK, f"{SGL} --speculative-draft-model-path my/head --speculative-algorithm DFLASH "
            "--speculative-num-draft-tokens 16"),
    (DDTREE, f"{SGL} --speculative-draft-model-path my/head --speculative-algorithm DFLASH "
             "--speculative-num-draft-tokens 16"),
    (SpecConfig(method="none"), SGL),
], ids=["ngram", "eagle3", "eagle", "standalone", "dflash", "ddtree", "none"])
def test_sglang_lines(config: SpecConfig, expected: str) -> None:
    line = launch_line("sglang", config, None, "my/head")
    assert line.command == expected
    if config.method == "dflash":  # the width is specchat's own: never a flag, said when it is a tree
        assert any("DDTree" in n for n in line.notes) == (config.eagle_topk > 1)
    if config.method == "ngram":  # SGLang dropped the match-window flags: left out, and said so
        assert any("match-window" in n for n in line.notes)
    assert not any("adaptive" in n for n in line.notes)  # the budget was off


@pytest.mark.parametrize(("config", "spec"), [
    (SpecConfig(method="ngram", num_draft_tokens=16, ngram_min_match_window_size=2, ngram_max_match_window_size=5),
     {"method": "ngram", "num_speculative_tokens": 15, "prompt_lookup_min": 2, "prompt_lookup_max": 5}),
    (_tree("eagle3"), {"method": "eagle3", "model": "my/head", "num_speculative_tokens": 4}),
    (_tree("eagle"), {"method": "eagle", "model": "my/head", "num_speculative_tokens": 4}),
    (_tree("standalone"), {"method": "draft_model", "model": "my/head", "num_speculative_tokens": 4}),
    (BLOCK, {"method": "dflash", "model": "my/head", "num_speculative_tokens": 15}),  # the block's guesses
    (DDTREE, {"method": "dflash", "model": "my/head", "num_speculative_tokens": 15}),  # the same chain
    (SpecConfig(method="none"), None),
], ids=["ngram", "eagle3", "eagle", "standalone", "dflash", "ddtree", "none"])
def test_vllm_lines(config: SpecConfig, spec: dict | None) -> None:
    line = launch_line("vllm", config, "org/model", "my/head")
    words = shlex.split(line.command)  # as the shell hands them to vllm
    assert words[:3] == ["vllm", "serve", "org/model"]
    if spec is None:
        assert words == ["vllm", "serve", "org/model"] and not line.notes
        return
    assert words[3] == "--speculative-config" and len(words) == 5
    parsed = json.loads(words[4])
    assert parsed == spec and set(parsed) <= VLLM_FIELDS
    assert line.command == f"vllm serve org/model --speculative-config '{json.dumps(spec)}'"
    if config.method in ("eagle", "eagle3", "standalone"):
        assert any("vLLM drafts a chain: no top-k tree" in n for n in line.notes)
    elif config is DDTREE:  # the tree of each block is lost, the chain is the block's guesses
        assert line.notes == ["vLLM drafts a chain: no top-k tree, so eagle_topk=2 and num_draft_tokens=16 do not "
                              "carry over; num_speculative_tokens = num_draft_tokens - 1 = 15 (tune with --grid "
                              "eagle_topk=1 to measure the chain)"]
    elif config.method == "ngram":
        assert any("prompt lookup" in n for n in line.notes)
    else:  # a block is a chain already: nothing is lost
        assert not line.notes


LLAMA = "llama-server -m /m/target.gguf"


@pytest.mark.parametrize(("config", "expected"), [
    (SpecConfig(method="ngram", num_draft_tokens=17, ngram_max_match_window_size=12, adaptive_draft=False),
     f"{LLAMA} --spec-type ngram-simple --spec-ngram-simple-size-n 12 --spec-ngram-simple-size-m 16 "
     "--spec-draft-n-max 16"),
    (_tree("standalone"), f"{LLAMA} --spec-type draft-simple -md /m/draft.gguf --spec-draft-n-max 4"),
    (_tree("eagle3"), f"{LLAMA} --spec-type draft-eagle3 -md /m/draft.gguf --spec-draft-n-max 4"),
    (BLOCK, f"{LLAMA} --spec-type draft-dflash -md /m/draft.gguf --spec-draft-n-max 15"),
    (DDTREE, f"{LLAMA} --spec-type draft-dflash -md /m/draft.gguf --spec-draft-n-max 15"),
    (_tree("eagle"), LLAMA),
    (_tree("medusa"), LLAMA),
    (SpecConfig(method="none"), LLAMA),
], ids=["ngram", "standalone", "eagle3", "dflash", "ddtree", "eagle", "medusa", "none"])
def test_llamacpp_lines(config: SpecConfig, expected: str) -> None:
    """llama-server drafts chains: a tree's depth (num_steps) or an n-gram tree's size less its root is the
    chain's length, said in a note; a method llama.cpp has no drafter for serves plain, and says so."""
    line = launch_line("llamacpp", config, "/m/target.gguf", "/m/draft.gguf")
    assert line.command == expected and line.server == "llama.cpp"
    notes = " ".join(line.notes)
    if config.method in ("eagle", "medusa"):
        runs = f"--method {methods.listed(methods.llamacpp_methods())}"
        assert f"llama.cpp has no {config.method} drafter" in notes and runs in notes and "eagle3" in runs
    elif config.method in ("standalone", "eagle3"):
        assert "llama.cpp drafts a chain: no top-k tree" in notes
    elif config.method == "dflash":
        assert ("top-k tree" in notes) == (config is DDTREE) and "its own converter" in notes
        assert config is not DDTREE or "--spec-draft-n-max = num_draft_tokens - 1 = 15" in notes
    elif config.method == "ngram":
        assert "one chain of 16 tokens" in notes


def test_llamacpp_reads_gguf_files_a_hub_id_through_hf_and_the_embedded_model_as_its_file(tmp_path: Path) -> None:
    from engine.models.resolve import embedded_gguf

    chain = SpecConfig(method="ngram", adaptive_draft=False)
    assert shlex.split(launch_line("llamacpp", chain, None).command)[1:3] == ["-m", str(embedded_gguf()[0])]
    assert launch_line("llamacpp", chain, "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF").command.startswith(
        "llama-server -hf Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF ")
    folder = launch_line("llamacpp", chain, str(tmp_path))  # safetensors: llama.cpp cannot read them
    assert folder.command.startswith("llama-server -m MODEL.gguf ")
    assert any("convert_hf_to_gguf.py" in n for n in folder.notes)
    assert "'/my models/x.gguf'" in launch_line("llamacpp", chain, "/my models/x.gguf").command


def test_export_llamacpp_on_the_command_line(capsys) -> None:
    assert main(["export", "llamacpp", "--method", "standalone", "--draft", "small.gguf",
                 "--speculative-eagle-topk", "1", "--speculative-num-steps", "3"]) == 0
    out, err = capsys.readouterr()
    assert out.strip().endswith("--spec-type draft-simple -md small.gguf --spec-draft-n-max 3")
    assert "no top-k tree" not in err  # a chain carries over whole


def test_medusa_goes_to_vllm_and_sglang_says_it_has_none() -> None:
    from engine.config import METHODS

    if "medusa" not in METHODS:
        pytest.skip("Medusa is not in this engine's methods")
    config = _tree("medusa")
    vllm = launch_line("vllm", config, "org/model", "my/heads")
    assert json.loads(shlex.split(vllm.command)[4]) == {"method": "medusa", "model": "my/heads",
                                                        "num_speculative_tokens": 4}
    assert any("medusa_tree" in n for n in vllm.notes)
    sglang = launch_line("sglang", config, "org/model", "my/heads")
    assert sglang.command == "python -m sglang.launch_server --model-path org/model"
    assert sglang.notes == ["SGLang has no medusa algorithm: this line serves without speculation"]


def test_a_chain_carries_over_to_vllm_without_a_note_and_drafts_need_naming() -> None:
    chain = SpecConfig(method="eagle3", num_steps=3, eagle_topk=1, num_draft_tokens=4, adaptive_draft=False)
    assert launch_line("vllm", chain, None, "h").notes == []
    placeholder = launch_line("sglang", chain, "/models/llama", None)
    assert "--speculative-draft-model-path PATH/TO/DRAFT" in placeholder.command
    assert any("needs its draft" in n for n in placeholder.notes)
    assert "adaptive" in " ".join(launch_line("vllm", chain.replace(adaptive_draft=True), None, "h").notes)
    assert serving_model("smollm2-135m") == serving_model(None) == EMBEDDED_HUB_ID
    assert serving_model("/my models/x") == "/my models/x"
    assert "'/my models/x'" in launch_line("vllm", chain, "/my models/x", "h").command  # quoted for the shell
    with pytest.raises(UsageError):
        launch_line("tgi", chain, None, None)


def test_export_prints_the_line_for_the_flags_and_a_settings_file(tmp_path: Path, capsys) -> None:
    assert main(["export", "vllm", "--method", "eagle3", "--draft", "my/head", "--speculative-num-steps", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == f"vllm serve {EMBEDDED_HUB_ID} --speculative-config " \
                  "'{\"method\": \"eagle3\", \"model\": \"my/head\", \"num_speculative_tokens\": 3}'\n"
    assert "note: vLLM drafts a chain" in err
    settings = tmp_path / "s.json"
    settings.write_text(json.dumps({"method": "ngram", "num_draft_tokens": 12, "adaptive_draft": False}))
    assert main(["export", "sglang", "--settings", str(settings), "--speculative-ngram-max-bfs-breadth", "3"]) == 0
    out = capsys.readouterr().out
    assert "--speculative-num-draft-tokens 12" in out and "--speculative-ngram-max-bfs-breadth 3" in out
    assert main(["export", "sglang", "--draft", "my/head"]) == 2  # no loading here: the method must be named
    assert "add --method" in capsys.readouterr().err


# --settings FILE ----------------------------------------------------------------------------------
def test_a_settings_file_is_read_back_under_the_flags(tmp_path: Path) -> None:
    config = SpecConfig(method="eagle3", num_steps=3, eagle_topk=1, num_draft_tokens=4, adaptive_draft=False)
    path = tmp_path / "best.json"
    path.write_text(json.dumps({k: getattr(config, k) for k in ("method", "num_steps", "eagle_topk",
                                                                 "num_draft_tokens", "adaptive_draft")}))
    assert config_from_args(parsed("run", "--settings", str(path))) == config
    flags = parsed("run", "--settings", str(path), "--speculative-num-steps", "5")
    assert config_from_args(flags) == config.replace(num_steps=5)  # the flag wins
    # the settings name the method: a draft alongside does not replace it
    drafted = parsed("run", "--settings", str(path), "--draft", "my/head")
    assert config_from_args(drafted).method == "eagle3" and draft_options(drafted)["method_from_draft"] is False
    tuning = parsed("tune", "--draft", "my/head", "--prompts", "p.jsonl")
    assert draft_options(tuning)["method_from_draft"] is False  # tune times the methods it lists, as bench does
    gen = parsed("generate", "--prompt", "hi", "--settings", str(path))
    assert make_config(gen.spec, method="ngram") == config


@pytest.mark.parametrize(("content", "says"), [
    (None, "no such file"),
    ("{", "not JSON"),
    ("[1]", "one JSON object"),
    ('{"warp": 3}', "unknown setting 'warp'"),
    ('{"num_steps": "3"}', "num_steps takes an integer, not '3'"),
    ('{"adaptive_draft": 1}', "adaptive_draft takes true or false"),
    ('{"num_steps": true}', "num_steps takes an integer"),
    ('{"method": "eagle3", "eagle_topk": 9, "num_draft_tokens": 4}', "eagle_topk=9 is more than the tree holds"),
])
def test_a_bad_settings_file_is_one_clear_line(tmp_path: Path, capsys, content: str | None, says: str) -> None:
    path = tmp_path / "s.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError) as err:
        load_settings(path)
    assert says in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)
    assert main(["export", "vllm", "--settings", str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_settings_accept_numbers_and_a_null_seed(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"temperature": 1, "seed": None, "top_p": 0.5}))
    assert load_settings(path) == {"temperature": 1, "seed": None, "top_p": 0.5}


# the palette ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("title", "expected"), [
    ("Copy vLLM launch line", "vllm serve org/m --speculative-config "),
    ("Copy SGLang launch line", "python -m sglang.launch_server --model-path org/m --speculative-algorithm NGRAM "
                                "--speculative-num-draft-tokens 5"),
    ("Copy llama.cpp launch line", "llama-server -hf org/m --spec-type ngram-simple"),
])
async def test_the_palette_copies_the_launch_line_of_the_settings_in_force(title: str, expected: str) -> None:
    session = make_session()
    app = make_app(session, serve_model="org/m")  # the model as `specchat run org/m` named it
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        assert app.apply_setting("method", "ngram") is None
        assert app.apply_setting("num_draft_tokens", "5") is None
        await palette(pilot, title.lower(), title)
        await wait_until(pilot, lambda: app.clipboard.startswith(expected), what="copied")
        server = next(key for key, shown in SERVERS.items() if f"Copy {shown} " in title)
        line = launch_line(server, app.applied_config, "org/m")
        assert app.clipboard == line.command
        assert any(n.message.startswith(line.command) and "(copied)" in n.title for n in app._notifications)
