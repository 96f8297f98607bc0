"""The text pipeline: text in, token ids through the model, text out.

    tokenizer.py      Tokenizer: HF `tokenizers` with the model's special tokens and chat template
    gguf_vocab.py     a Tokenizer rebuilt from a GGUF file's vocabulary (llama.cpp's pre-tokenizers)
    chars.py          a character tokenizer for training demos
    chat_template.py  chat templates rendered as HF does (sandboxed jinja2)
    detokenizer.py    the incremental detokenizer (UTF-8 safe text deltas)
    stops.py          stop strings held back until decided; one generated row's text as it grows
"""
