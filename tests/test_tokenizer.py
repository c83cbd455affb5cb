"""engine.tokenizer: encode/decode, chat templates (checked against transformers), stop tokens,
display pieces and the incremental decoder.

Fast tests use a tiny byte-level BPE tokenizer built here; the slow ones use the converted
embedded SmolLM2 tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from engine.tokenizer import (
    ChatTemplateError,
    IncrementalDecoder,
    Tokenizer,
    TokenizerError,
    _unicode_to_byte,
    show_bytes,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Merges chosen to produce multi-byte pieces: "Ã©" is é (C3 A9), "ðŁĺ" the first three bytes of
# 😀 (F0 9F 98 80), "Ġ" is a space.
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("l", "d"),
    ("Ġwor", "ld"), ("Ã", "©"), ("ð", "Ł"), ("ðŁ", "ĺ"), ("i", "n"), ("Ġ", "a"), ("Ċ", "Ċ"),
]  # fmt: skip
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Exercises whitespace control, namespace, loop controls, tojson, raise_exception, bos_token and
# the {% generation %} tag.
RICH_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(sys='', n=0) %}
{% for m in messages %}
    {% if m['role'] == 'system' %}
        {% set ns.sys = m['content'] %}
        {% continue %}
    {% endif %}
    {% if m['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('unsupported role ' + m['role']) }}
    {% endif %}
    {% set ns.n = ns.n + 1 %}
<|im_start|>{{ m['role'] }}
    {% if m['role'] == 'assistant' %}
{% generation %}{{ m['content'] | trim }}{% endgeneration %}<|im_end|>
    {% else %}
{{ m['content'] }}<|im_end|>
    {% endif %}
{% endfor %}
{% if tools %}<|im_start|>tools
{{ tools | tojson }}<|im_end|>
{% endif %}
{% if ns.sys %}[system: {{ ns.sys }} / {{ ns.n }} turns]
{% endif %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief & <polite>."}, {"role": "user", "content": "héllo 😀"}],
    [
        {"role": "user", "content": "the world"},
        {"role": "assistant", "content": "  in the world  "},
        {"role": "user", "content": "again\n\nand again"},
    ],
]
TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "Uhrzeit <jetzt>", "parameters": {}}}]


def build_backend() -> Backend:
    byte_chars = sorted(_unicode_to_byte(), key=_unicode_to_byte().__getitem__)
    vocab: dict[str, int] = {}
    for tok in [*SPECIALS, *byte_chars, *(a + b for a, b in MERGES)]:
        vocab.setdefault(tok, len(vocab))
    backend = Backend(models.BPE(vocab=vocab, merges=MERGES))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return backend


def write_tiny(folder: Path, **config: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    build_backend().save(str(folder / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "chat_template": CHATML,
    }
    cfg.update(config)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("tiny-tok"))


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_dir)


# loading ---------------------------------------------------------------------------------
def test_from_dir_reads_config(tiny: Tokenizer) -> None:
    assert tiny.chat_template == CHATML
    assert tiny.special_tokens["eos_token"] == "<|im_end|>"
    assert tiny.eos_token_id == 2 and tiny.bos_token_id == 1
    assert tiny.vocab_size == 3 + 256 + len(MERGES)


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)


def test_invalid_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(TokenizerError, match=r"not a valid tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)


def test_chat_template_jinja_file_wins(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path)
    (folder / "chat_template.jinja").write_text("JINJA{{ messages | length }}")
    assert Tokenizer.from_dir(folder).apply_chat_template([{"role": "user", "content": "x"}]) == "JINJA1"


def test_named_chat_templates_and_added_token_dicts(tmp_path: Path) -> None:
    folder = write_tiny(
        tmp_path,
        chat_template=[{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
        eos_token={"__type": "AddedToken", "content": "<|endoftext|>", "special": True},
    )
    tok = Tokenizer.from_dir(folder)
    assert tok.chat_template == "D"
    assert tok.special_tokens["eos_token"] == "<|endoftext|>"


def test_added_tokens_decoder_fills_gaps(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path, added_tokens_decoder={"273": {"content": "<tool>", "special": True}})
    tok = Tokenizer.from_dir(folder)
    assert tok.token_to_id("<tool>") == 273
    assert tok.encode("a<tool>b") == [tok.token_to_id("a"), 273, tok.token_to_id("b")]


# encode / decode -------------------------------------------------------------------------
def test_encode_decode_roundtrip(tiny: Tokenizer) -> None:
    text = "the world héllo 😀\n\nin the world"
    ids = tiny.encode(text)
    assert tiny.token_to_id("Ġworld") in ids and tiny.token_to_id("Ã©") in ids
    assert tiny.decode(ids) == text


def test_special_tokens_in_text_are_single_ids(tiny: Tokenizer) -> None:
    assert tiny.encode("<|im_start|>user") == [1, *tiny.encode("user")]
    assert tiny.decode([1, 2], skip_special_tokens=True) == ""
    assert tiny.decode([1, 2]) == "<|im_start|><|im_end|>"


# chat templates --------------------------------------------------------------------------
def test_chatml_render(tiny: Tokenizer) -> None:
    text = tiny.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == (
        "<|im_start|>system\nYou are a tiny test model<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tiny.encode_chat([{"role": "user", "content": "hi"}]) == tiny.encode(text)


def test_raise_exception(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(write_tiny(tmp_path, chat_template=RICH_TEMPLATE))
    with pytest.raises(ChatTemplateError, match="unsupported role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_template_syntax_error(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(write_tiny(tmp_path, chat_template="{% for m in messages %}"))
    with pytest.raises(ChatTemplateError, match="not valid jinja"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_template_sandbox(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(write_tiny(tmp_path, chat_template="{{ messages.__class__.__mro__ }}"))
    with pytest.raises(ChatTemplateError):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    tok = Tokenizer.from_dir(write_tiny(tmp_path, chat_template="{% set ns = namespace(_x=1) %}"))
    with pytest.raises(ChatTemplateError, match="underscore"):
        tok.apply_chat_template([])


def test_strftime_now_and_tojson(tmp_path: Path) -> None:
    template = "{{ strftime_now('%Y') }}|{{ {'a': '<ü>'} | tojson }}|{{ [1] | tojson(indent=2) }}"
    tok = Tokenizer.from_dir(write_tiny(tmp_path, chat_template=template))
    year, js, indented = tok.apply_chat_template([]).split("|")
    assert len(year) == 4 and year.isdigit()
    assert js == '{"a": "<ü>"}'  # no HTML escaping, no ASCII escaping
    assert indented == "[\n  1\n]"


def test_no_chat_template(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokenizerError, match="no chat template"):
        Tokenizer.from_dir(folder).apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("template", ["chatml", "rich"])
def test_chat_template_matches_transformers(tmp_path: Path, template: str) -> None:
    transformers = pytest.importorskip("transformers")
    source = CHATML if template == "chatml" else RICH_TEMPLATE
    folder = write_tiny(tmp_path, chat_template=source)
    ours = Tokenizer.from_dir(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    for conversation in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            for tools in (None, TOOLS):
                expected = theirs.apply_chat_template(
                    conversation, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
                )
                got = ours.apply_chat_template(conversation, add_generation_prompt, tools=tools)
                assert got == expected
                assert ours.encode(got) == theirs.encode(expected, add_special_tokens=False)


# stop tokens -------------------------------------------------------------------------------
def test_stop_tokens_chatml(tiny: Tokenizer) -> None:
    assert tiny.stop_token_ids == frozenset({2})  # <|endoftext|> is not the eos: not a stop


def test_stop_tokens_endoftext_as_eos(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(write_tiny(tmp_path, eos_token="<|endoftext|>"))
    assert tok.stop_token_ids == frozenset({0, 2})


def test_stop_tokens_from_generation_config(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 17]}))
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 18}))
    assert Tokenizer.from_dir(folder).stop_token_ids == frozenset({2, 17, 18})


def test_chat_end_token_must_be_an_added_token(tmp_path: Path) -> None:
    # "<|end|>" as an ordinary vocabulary entry is text, not an end-of-turn marker
    backend = build_backend()
    data = json.loads(backend.to_str())
    data["model"]["vocab"]["<|end|>"] = len(data["model"]["vocab"])
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.token_to_id("<|end|>") is not None
    assert tok.stop_token_ids == frozenset({2})


# pieces --------------------------------------------------------------------------------------
def test_pieces(tiny: Tokenizer) -> None:
    tid = tiny.token_to_id
    assert tiny.piece(tid("Ġthe")) == " the"
    assert tiny.piece(tid("Ġ")) == " "
    assert tiny.piece(tid("Ċ")) == "\n"
    assert tiny.piece(tid("Ã©")) == "é"
    assert tiny.piece(tid("ð")) == "<0xF0>"
    assert tiny.piece(tid("ðŁĺ")) == "<0xF0><0x9F><0x98>"
    assert tiny.piece(tid("Ģ")) == "<0x80>"
    assert tiny.piece(2) == "<|im_end|>"


def test_show_bytes() -> None:
    assert show_bytes(b"a\xe2\x82") == "a<0xE2><0x82>"
    assert show_bytes("é€".encode()) == "é€"
    assert show_bytes(b"\x80x\xff") == "<0x80>x<0xFF>"
    assert show_bytes(b"") == ""


# incremental decoding -------------------------------------------------------------------------
def test_incremental_split_character(tiny: Tokenizer) -> None:
    ids = tiny.encode(" 😀 the world")
    dec = IncrementalDecoder(tiny)
    outs = [dec.push(i) for i in ids]
    assert "" in outs  # the emoji's first bytes wait for the rest
    assert "".join(outs) + dec.flush() == " 😀 the world"
    assert outs[-1] == " world"


def test_incremental_flush_incomplete(tiny: Tokenizer) -> None:
    dec = tiny.incremental_decoder()
    assert dec.push(tiny.token_to_id("ðŁĺ")) == ""
    assert dec.flush() == "\ufffd"
    assert dec.flush() == ""


def test_incremental_context(tiny: Tokenizer) -> None:
    context = tiny.encode_chat([{"role": "user", "content": "hi"}])
    dec = tiny.incremental_decoder(context)
    ids = tiny.encode("the world")
    assert "".join(dec.push(i) for i in ids) + dec.flush() == "the world"


def _check_stream(tok: Tokenizer, ids: list[int], skip: bool) -> None:
    dec = IncrementalDecoder(tok, skip_special_tokens=skip)
    text = "".join(dec.push(i) for i in ids) + dec.flush()
    assert text == tok.decode(ids, skip_special_tokens=skip)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(0, 3 + 256 + len(MERGES) - 1), max_size=40), skip=st.booleans())
def test_incremental_matches_decode(tiny: Tokenizer, ids: list[int], skip: bool) -> None:
    _check_stream(tiny, ids, skip)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    context=st.lists(st.integers(0, 3 + 256 + len(MERGES) - 1), max_size=12),
    ids=st.lists(st.integers(0, 3 + 256 + len(MERGES) - 1), max_size=20),
)
def test_incremental_with_context(tiny: Tokenizer, context: list[int], ids: list[int]) -> None:
    prefix = tiny.decode(context)
    assume("\ufffd" not in prefix)  # a real prompt ends on complete characters
    dec = IncrementalDecoder(tiny, context)
    text = "".join(dec.push(i) for i in ids) + dec.flush()
    assert text == tiny.decode(context + ids)[len(prefix) :]


# the real SmolLM2 tokenizer -----------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.models.resolve import resolve_model

    # one conversion per test session: every slow module points at the same cache folder
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECCHAT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "specchat-cache"))
    try:
        return resolve_model(None).path
    finally:
        mp.undo()


REAL_TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\n\nnew lines  ",
    "naïve café — “quotes” 😀👍🏽 中文 日本語 한국어",
    "def f(x):\n    return x ** 2  # code",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.mark.slow
def test_real_tokenizer_matches_transformers(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    ours = Tokenizer.from_dir(smollm2_dir)
    theirs = AutoTokenizer.from_pretrained(str(smollm2_dir))
    for text in REAL_TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=False)
    for conversation in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            expected = theirs.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            assert ours.apply_chat_template(conversation, add_generation_prompt) == expected
            expected_ids = theirs.apply_chat_template(
                conversation, tokenize=True, add_generation_prompt=add_generation_prompt
            )
            expected_ids = expected_ids["input_ids"] if not isinstance(expected_ids, list) else expected_ids
            assert ours.encode_chat(conversation, add_generation_prompt) == list(expected_ids)
    assert ours.stop_token_ids == frozenset({2})  # <|im_end|>
    assert ours.piece(ours.token_to_id("Ġworld")) == " world"
    emoji = ours.encode(" 😀")
    assert "".join(ours.piece(i) for i in emoji).startswith(" <0xF0>")


@pytest.mark.slow
def test_real_incremental_decoder(smollm2_dir: Path) -> None:
    tok = Tokenizer.from_dir(smollm2_dir)
    for text in REAL_TEXTS:
        ids = tok.encode(text)
        dec = tok.incremental_decoder(tok.encode_chat([{"role": "user", "content": "x"}]))
        assert "".join(dec.push(i) for i in ids) + dec.flush() == text

    @settings(max_examples=300, deadline=None)
    @given(ids=st.lists(st.integers(0, tok.vocab_size - 1), max_size=30), skip=st.booleans())
    def check(ids: list[int], skip: bool) -> None:
        _check_stream(tok, ids, skip)

    check()
