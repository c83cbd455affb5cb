"""A light tokenizer: the ``tokenizers`` library plus a chat-template renderer, no transformers.

Why not ``transformers.AutoTokenizer``: importing transformers costs seconds at every start of
the app, and all we need is encode/decode, the chat template and the stop tokens. The template
rendering follows transformers' conventions (sandboxed jinja2, ``trim_blocks``/``lstrip_blocks``,
``raise_exception``, ``strftime_now``, a non-HTML-escaping ``tojson``) so that prompts are
token-for-token what transformers would build; tests check that against transformers itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from engine.errors import UserError
from engine.files import JSON_LIMIT, TOKENIZER_LIMIT, UnreadableFileError, read_text
from engine.jsonl import loads

Message = Mapping[str, Any]

# End-of-turn markers of common chat formats (ChatML, Llama 3, Phi-3, Gemma). A model stops on
# the one its template uses; they only count when the tokenizer has them as added tokens.
CHAT_END_TOKENS: tuple[str, ...] = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
# Ends a document, not a turn: a stop token only for models that use it as their eos.
_EOS_ONLY_TOKENS: tuple[str, ...] = ("<|endoftext|>",)
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenizerError(UserError, ValueError):
    """A tokenizer folder or chat template that cannot be used; the message says why."""


class ChatTemplateError(TokenizerError):
    """The chat template refused the conversation (``raise_exception``) or failed to render."""


class Tokenizer:
    """Encode, decode and chat-format text for one model.

    Build it with :meth:`from_dir`. ``stop_token_ids`` holds every id that ends an answer.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        # bos_token / eos_token / pad_token / unk_token strings, as the chat template sees them
        self.special_tokens: dict[str, str] = dict(special_tokens or {})
        self._added: set[int] = set(backend.get_added_tokens_decoder())
        self._decoder_kinds = _decoder_kinds(backend)
        self._pieces: dict[int, str] = {}
        self._template: jinja2.Template | None = None
        self.stop_token_ids: frozenset[int] = self._stop_ids(eos_token_ids)

    # construction -------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: Path | str) -> Tokenizer:
        """Load ``tokenizer.json`` and the chat/eos settings saved next to it.

        Reads tokenizer_config.json (template, special tokens, added tokens), chat_template.jinja
        (transformers >= 5 keeps the template there; it wins, as in transformers),
        generation_config.json and config.json (eos ids).
        """
        folder = Path(path)
        tok_file = folder / "tokenizer.json"
        if not tok_file.exists():  # a FIFO or a device there is refused as such by read_text below
            raise TokenizerError(
                f"{folder} has no tokenizer.json; tokenizers that ship only a sentencepiece model must be "
                "converted first (load with transformers' AutoTokenizer and save_pretrained)"
            )
        try:  # read by us, bounded and never from a FIFO; then parsed by the Rust side
            backend = Backend.from_str(read_text(tok_file, limit=TOKENIZER_LIMIT, what="a tokenizer.json"))
        except UnreadableFileError as e:
            raise TokenizerError(str(e)) from None
        except Exception as e:  # the Rust side raises plain Exception subclasses
            raise TokenizerError(f"{tok_file} is not a valid tokenizer.json ({e})") from e

        config = _read_json(folder / "tokenizer_config.json")
        _add_missing_tokens(backend, config.get("added_tokens_decoder") or {})
        special = {
            key: value
            for key in ("bos_token", "eos_token", "pad_token", "unk_token")
            if (value := _token_content(config.get(key))) is not None
        }
        eos_ids: list[int] = []
        for extra in (_read_json(folder / "generation_config.json"), _read_json(folder / "config.json")):
            eos_ids += _as_id_list(extra.get("eos_token_id"))
        return cls(
            backend,
            chat_template=_find_chat_template(folder, config),
            special_tokens=special,
            eos_token_ids=eos_ids,
        )

    def _stop_ids(self, eos_token_ids: Iterable[int]) -> frozenset[int]:
        ids = set(eos_token_ids)
        eos = self.special_tokens.get("eos_token")
        names = [*CHAT_END_TOKENS, *(t for t in _EOS_ONLY_TOKENS if t == eos)]
        if eos is not None and (eos_id := self.backend.token_to_id(eos)) is not None:
            ids.add(eos_id)
        for name in names:
            token_id = self.backend.token_to_id(name)
            if token_id is not None and token_id in self._added:
                ids.add(token_id)
        return frozenset(ids)

    # basics -------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        eos = self.special_tokens.get("eos_token")
        return None if eos is None else self.backend.token_to_id(eos)

    @property
    def bos_token_id(self) -> int | None:
        bos = self.special_tokens.get("bos_token")
        return None if bos is None else self.backend.token_to_id(bos)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. Special tokens written in the text (``<|im_start|>``) are always
        recognised; ``add_special_tokens`` only adds what the post-processor adds (e.g. a BOS)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # chat ---------------------------------------------------------------------------------
    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render ``messages`` with the model's chat template, as transformers does.

        Extra keyword arguments reach the template (``tools``, ``enable_thinking``, ...).
        """
        if self.chat_template is None:
            raise TokenizerError("this tokenizer has no chat template; use a chat (instruct) model")
        if self._template is None:
            self._template = _compile(self.chat_template)
        variables: dict[str, Any] = {"tools": None, "documents": None, **self.special_tokens, **kwargs}
        try:
            return self._template.render(
                messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **variables
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template failed: {e}") from e

    def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
        """Token ids of the rendered conversation (the template writes any BOS itself)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs))

    def incremental_decoder(
        self, context_ids: Sequence[int] = (), *, skip_special_tokens: bool = False
    ) -> IncrementalDecoder:
        """A streaming decoder for an answer that follows ``context_ids`` (the prompt's tail)."""
        return IncrementalDecoder(self, context_ids, skip_special_tokens=skip_special_tokens)

    # display ------------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes | None:
        """The raw bytes one token stands for, or None when it is not a byte-level piece.

        Needed because decoding a single token that holds half of a UTF-8 character yields
        U+FFFD; the draft-tree view wants the honest bytes instead.
        """
        if token_id in self._added:
            return None
        token = self.backend.id_to_token(token_id)
        if token is None:
            return None
        if "ByteLevel" in self._decoder_kinds:
            table = _unicode_to_byte()
            if all(ch in table for ch in token):
                return bytes(table[ch] for ch in token)
            return None
        if "ByteFallback" in self._decoder_kinds and (m := _BYTE_TOKEN.fullmatch(token)):
            return bytes([int(m.group(1), 16)])
        if self._decoder_kinds & {"Metaspace", "Replace"}:
            return token.replace("\u2581", " ").encode("utf-8")
        return None

    def piece(self, token_id: int) -> str:
        """Display text of one token: leading spaces kept, split UTF-8 shown as ``<0xE2>``."""
        cached = self._pieces.get(token_id)
        if cached is None:
            raw = self.token_bytes(token_id)
            cached = self.decode([token_id]) if raw is None else show_bytes(raw)
            self._pieces[token_id] = cached
        return cached


class IncrementalDecoder:
    """Turn a stream of token ids into text deltas, one :meth:`push` per token.

    Decoding tokens one at a time goes wrong in two ways: a character split across tokens
    decodes to U+FFFD halves, and decoders that strip the leading space of a sequence eat the
    space of every token. So each push decodes a short window that starts a few tokens back
    (``prefix_offset``) and emits only what the new tokens added past ``read_offset``, holding
    back output while it still ends in an incomplete character. The concatenated pushes plus
    :meth:`flush` equal ``decode(all ids)``.
    """

    _CONTEXT = 16  # at most this many context_ids are kept as left context

    def __init__(self, tokenizer: Tokenizer, context_ids: Sequence[int] = (), *, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(context_ids[-self._CONTEXT :]) if context_ids else []
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, start: int, stop: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[start:stop], skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ("" while a character is pending)."""
        self.ids.append(token_id)
        prefix = self._decode(self.prefix_offset, self.read_offset)
        text = self._decode(self.prefix_offset)
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        prefix = self._decode(self.prefix_offset, self.read_offset)
        text = self._decode(self.prefix_offset)
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :]


# helpers ----------------------------------------------------------------------------------
def show_bytes(raw: bytes) -> str:
    """Decode UTF-8, writing each byte that is not part of a complete character as ``<0xNN>``."""
    out: list[str] = []
    while raw:
        try:
            out.append(raw.decode("utf-8"))
            break
        except UnicodeDecodeError as e:
            out.append(raw[: e.start].decode("utf-8"))
            out.extend(f"<0x{b:02X}>" for b in raw[e.start : e.end])
            raw = raw[e.end :]
    return "".join(out)


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of byte-level BPE's byte -> printable character table.

    Byte-level BPE (GPT-2 and descendants) writes every byte as a visible character: printable
    Latin-1 bytes stand for themselves, the other 68 bytes (controls, space, ...) are moved to
    U+0100 onwards in byte order, which is why a space shows up as "Ġ" (U+0120).
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    shifted = [b for b in range(256) if b not in set(printable)]
    table.update({chr(0x100 + n): b for n, b in enumerate(shifted)})
    return table


def _decoder_kinds(backend: Backend) -> frozenset[str]:
    """The decoder types (flattening Sequence) of a tokenizer, e.g. {"ByteLevel"}."""
    decoder = backend.decoder
    if decoder is None:
        return frozenset()
    kinds: set[str] = set()

    def walk(spec: Mapping[str, Any]) -> None:
        kinds.add(spec.get("type", ""))
        for child in spec.get("decoders") or ():
            walk(child)

    try:
        walk(json.loads(decoder.__getstate__()))
    except (ValueError, TypeError, AttributeError):
        kinds.add(type(decoder).__name__)
    return frozenset(kinds)


def _read_json(path: Path) -> dict[str, Any]:
    """A side file of the tokenizer ({} where there is none), read bounded (engine/files.py)."""
    if not path.is_file():
        return {}
    try:
        data = loads(read_text(path, limit=JSON_LIMIT, what="a JSON file"))
    except UnreadableFileError as e:
        raise TokenizerError(str(e)) from None
    except ValueError as e:
        raise TokenizerError(f"{path} is not valid JSON ({e})") from e
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    """Special tokens are saved as a string or as an AddedToken dict ({"content": ...})."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _as_id_list(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _add_missing_tokens(backend: Backend, added: Mapping[str, Any]) -> None:
    """Add tokens listed in tokenizer_config's added_tokens_decoder that tokenizer.json lacks
    (older savers kept some only there). Tokens that would land on another id are skipped."""
    for key, spec in sorted(added.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1):
        content = _token_content(spec)
        if content is None or not key.isdigit() or backend.token_to_id(content) is not None:
            continue
        if int(key) != backend.get_vocab_size(with_added_tokens=True):
            continue
        token = AddedToken(
            content,
            single_word=bool(spec.get("single_word", False)),
            lstrip=bool(spec.get("lstrip", False)),
            rstrip=bool(spec.get("rstrip", False)),
            normalized=bool(spec.get("normalized", not spec.get("special", False))),
            special=bool(spec.get("special", False)),
        )
        if token.special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])


def _find_chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        try:
            return read_text(jinja_file, limit=JSON_LIMIT, what="a chat template")
        except (UnreadableFileError, UnicodeDecodeError) as e:
            raise TokenizerError(f"{jinja_file}: {e}" if isinstance(e, UnicodeDecodeError) else str(e)) from None
    template = config.get("chat_template")
    if template is None:
        template = _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None


# chat-template environment -----------------------------------------------------------------
class _GenerationBlock(jinja2.ext.Extension):
    """Accept ``{% generation %}...{% endgeneration %}`` (used by some templates to mark the
    assistant's text for training masks) and render its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension API declares this as a class attribute

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore names, so templates cannot poke at internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise ChatTemplateError(f"chat templates may not set underscore attributes ({name!r})")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson HTML-escapes <, >, & and ' -- wrong for prompts.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template is not valid jinja (line {e.lineno}: {e.message})") from e
