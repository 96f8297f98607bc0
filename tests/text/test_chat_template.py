"""Chat templates render exactly what HF transformers' apply_chat_template renders."""

from __future__ import annotations

import pytest

from anatomy.text.chat_template import ChatTemplate
from anatomy.errors import CheckpointError, InputError

CONVERSATIONS = {
    "user only": [{"role": "user", "content": "What is the capital of France?"}],
    "system": [{"role": "system", "content": "You answer in one word."},
               {"role": "user", "content": "Capital of Italy?"}],
    "multi-turn": [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "Hi!"},
                   {"role": "assistant", "content": "Hello. How can I help?"},
                   {"role": "user", "content": "Write 2+2 in words.\nThanks."}],
    "no system, multi-turn": [{"role": "user", "content": "你好 😀"},
                              {"role": "assistant", "content": "{{ not jinja }} <|im_end|>"},
                              {"role": "user", "content": "  spaces  \n\n"}],
}

LLAMA3_LIKE = (
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['role'] not in ['system', 'user', 'assistant'] %}\n"
    "        {{- raise_exception('Unknown role: ' + message['role']) }}\n"
    "    {%- endif %}\n"
    "    {%- set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}\n"
    "    {{- content }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}\n"
)

# block tags on their own, indented lines: the output depends on trim_blocks and lstrip_blocks
INDENTED_BLOCKS = (
    "{% for m in messages %}\n"
    "    {% if m.role == 'user' %}\n"
    "User: {{ m.content }}\n"
    "    {% else %}\n"
    "{{ m.role | capitalize }}: {{ m.content }}{{ eos_token }}\n"
    "    {% endif %}\n"
    "    {% if loop.index >= 3 %}{% break %}{% endif %}\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

WITH_TOJSON = (
    "{% if tools %}Tools: {{ tools | tojson(indent=2) }}\n{% endif %}"
    "{% for m in messages %}{{ m | tojson }}\n{% endfor %}"
)

TOOLS = [{"name": "weather", "description": "Météo à <Paris> & ailleurs", "parameters": {"city": "str"}}]


@pytest.mark.slow
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name", CONVERSATIONS)
def test_smollm2_template_matches_hf(smollm2_tokenizer, hf_smollm2_tokenizer, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    ours = smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf_smollm2_tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt)
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n") == add_generation_prompt


@pytest.mark.slow
@pytest.mark.parametrize("template", [LLAMA3_LIKE, INDENTED_BLOCKS, WITH_TOJSON])
@pytest.mark.parametrize("name", CONVERSATIONS)
def test_other_templates_match_hf(hf_smollm2_tokenizer, template, name):
    hf = hf_smollm2_tokenizer
    ours = ChatTemplate(template, source="test", special_tokens={"bos_token": hf.bos_token, "eos_token": hf.eos_token})
    messages = CONVERSATIONS[name]
    for add_generation_prompt in (True, False):
        expected = hf.apply_chat_template(messages, chat_template=template, tools=TOOLS, tokenize=False,
                                          add_generation_prompt=add_generation_prompt)
        assert ours.render(messages, add_generation_prompt=add_generation_prompt, tools=TOOLS) == expected


def test_raise_exception_becomes_input_error():
    template = ChatTemplate(LLAMA3_LIKE, source="test", special_tokens={"bos_token": "<s>"})
    with pytest.raises(InputError, match="Unknown role: robot"):
        template.render([{"role": "robot", "content": "beep"}])


@pytest.mark.parametrize("messages, match", [
    ([{"role": "user"}], "message 0 has no 'content'"),
    ([{"content": "hi"}], "message 0 has no 'role'"),
    ([{"role": "user", "content": "a"}, "just text"], "message 1 must be a dict"),
    ([{"role": 3, "content": "a"}], "'role' must be a string"),
    ("hello", "non-empty list"),
    ([], "non-empty list"),
])
def test_malformed_messages_are_value_errors(smollm2_tokenizer, messages, match):
    with pytest.raises(ValueError, match=match) as info:
        smollm2_tokenizer.apply_chat_template(messages)
    assert isinstance(info.value, InputError)


def test_bad_template_is_checkpoint_error():
    with pytest.raises(CheckpointError, match="model.gguf: chat template line 1"):
        ChatTemplate("{% for m in messages %}", source="model.gguf", special_tokens={})


def test_template_runs_sandboxed():
    """A template is code from the checkpoint: it must not reach Python internals."""
    template = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}", source="t", special_tokens={})
    with pytest.raises(InputError):
        template.render([{"role": "user", "content": "x"}])
