"""Every command that takes a model, with every form its --help names: a preset name, a config.json,
its directory (no weights), an HF directory with weights, a .gguf file and an installed model name.

A form a command can use gives the answer the API (or the model itself) gives; a form it cannot
use (generation from a config without weights) is one line naming the file and the rule, exit 2.
The decoder forms are one tiny random LLaMA-style model (SmolLM2's tokenizer, so that it has a
chat template) saved both ways; the installed names are the two embedded models.
"""

from __future__ import annotations

import io
import json
import shutil
import urllib.request

import pytest
import torch

import anatomy
from anatomy.cli import main

from ..conftest import tiny_chat_model

FORMS = ("preset", "config", "config-dir", "hf", "gguf", "installed")
WITHOUT_WEIGHTS = ("preset", "config", "config-dir")
SLOW = {"installed", "preset"}  # the real 135M-parameter model, or a preset's random 124M
PROMPT = "Name a river."


def _forms(params):
    """pytest params of FORMS, the real-size ones marked slow."""
    return [pytest.param(f, marks=pytest.mark.slow) if f in params else f for f in FORMS]


@pytest.fixture(scope="module")
def decoder_forms(tmp_path_factory):
    """{form: what a user types} for one tiny decoder (and its tokenizer) in every form; "model" is
    the decoder itself."""
    root = tmp_path_factory.mktemp("forms")
    model = tiny_chat_model(root / "hf", root / "tiny.gguf")
    (root / "config-dir").mkdir()
    shutil.copy(root / "hf" / "config.json", root / "config-dir" / "config.json")
    return {"preset": "gpt2", "config": str(root / "config-dir" / "config.json"), "config-dir": str(root / "config-dir"),
            "hf": str(root / "hf"), "gguf": str(root / "tiny.gguf"), "installed": "smollm2-135m-instruct",
            "model": model}


@pytest.fixture(scope="module")
def encoder_forms(tmp_path_factory):
    """The same for the encoder commands: all-minilm-l6-v2 as a directory, its config alone, a
    decoder's .gguf (which cannot embed) and the name."""
    from anatomy.checkpoints.registry import resolve

    root = tmp_path_factory.mktemp("encoder")
    minilm = resolve("all-minilm-l6-v2")
    shutil.copy(minilm / "config.json", root / "config.json")
    return {"preset": "bert-base", "config": str(root / "config.json"), "config-dir": str(root), "hf": str(minilm),
            "gguf": str(resolve("smollm2-135m-instruct")), "installed": "all-minilm-l6-v2"}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _refused(code: int, err: str, command: str, name: str) -> None:
    """One line, exit 2, naming what was given and the rule."""
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"anatomy {command}: error: "), err
    assert name in err and "needs weights" in err and "a .gguf file or an HF directory with model.safetensors" in err


# -- the anatomy of any form ---------------------------------------------------------------------

def _parameters(form: str, decoder_forms) -> int:
    """The parameter count each form's model has (the preset and the installed model: their known totals)."""
    return {"preset": 124_439_808, "installed": 134_515_008}.get(
        form, sum(p.numel() for p in decoder_forms["model"].parameters()))


@pytest.mark.parametrize("form", FORMS)
def test_inspect(form, decoder_forms, capsys):
    name = decoder_forms[form]
    code, out, err = _run(capsys, "inspect", "--model", name, "--json", "--seq-len", "8", "--context", "64")
    assert code == 0, err
    report = json.loads(out)
    counted = _parameters(form, decoder_forms)
    assert report["params"]["total"] == counted
    stored = report["memory"].get("stored_weights")
    if form in WITHOUT_WEIGHTS:
        assert stored is None
    elif form == "hf":
        assert stored["bytes"] == sum(p.numel() * 4 for p in decoder_forms["model"].parameters())  # f32 safetensors
    else:
        assert stored["bytes"] > 0 and set(stored["by_format"]) <= {"F32", "F16", "Q4_1", "Q8_0"}


def test_inspect_page_and_mixtral_count_of_a_config_alone(decoder_forms, tmp_path, capsys):
    """A downloaded config.json with no weights: the page, and Mixtral's total and active counts."""
    from anatomy.checkpoints.hf_config import config_to_hf

    page = tmp_path / "page.html"
    code, _, err = _run(capsys, "inspect", "--model", decoder_forms["config"], "--html", str(page), "--seq-len", "8")
    assert code == 0 and f"wrote {page}" in err
    assert "<svg" in page.read_text(encoding="utf-8")
    (tmp_path / "mixtral").mkdir()
    (tmp_path / "mixtral" / "config.json").write_text(json.dumps(config_to_hf(anatomy.get_preset("mixtral-8x7b"))))
    for name in (tmp_path / "mixtral", tmp_path / "mixtral" / "config.json"):
        code, out, err = _run(capsys, "inspect", "--model", str(name), "--json", "--seq-len", "4", "--context", "64")
        assert code == 0, err
        params = json.loads(out)["params"]
        assert (params["total"], params["active"]) == (46_702_792_704, 12_879_925_248)


def test_compare_takes_every_form_at_once(decoder_forms, capsys):
    names = [decoder_forms[f] for f in FORMS]
    code, out, err = _run(capsys, "compare", *names, "--json", "--seq-len", "8", "--context", "64")
    assert code == 0, err
    totals = [r["params"]["total"] for r in json.loads(out).values()]
    assert totals == [_parameters(f, decoder_forms) for f in FORMS]


@pytest.mark.parametrize("form", _forms(SLOW))
def test_profile(form, decoder_forms, capsys):
    """A checkpoint runs on its weights; a preset or a config without weights on random ones."""
    name = decoder_forms[form]
    code, out, err = _run(capsys, "profile", "--model", name, "--prompt-len", "4", "--new-tokens", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    counted = _parameters(form, decoder_forms)
    assert report["model"]["parameters"] == counted and report["model"]["name"] == name
    assert report["phases"]["decode"]["step_s"] > 0


def test_the_old_positional_model_is_one_mechanism(decoder_forms, capsys):
    """`anatomy inspect MODEL` and `anatomy profile MODEL`: the same report as --model, one warning line."""
    name = decoder_forms["config"]
    for command, options in (("inspect", ["--seq-len", "8"]), ("profile", ["--prompt-len", "4", "--new-tokens", "2"])):
        code, out, err = _run(capsys, command, name, *options, "--json")
        assert code == 0 and err == (f"anatomy {command}: warning: `anatomy {command} {name}` is deprecated, "
                                     f"use `anatomy {command} --model {name}`\n")
        assert json.loads(out)["model"]["name"] == name
        code, _, err = _run(capsys, command, name, "--model", name)
        assert code == 2 and f"two models: --model {name} and {name}" in err


# -- the commands that need weights --------------------------------------------------------------

def _greedy(name: str, max_new_tokens: int = 4) -> str:
    r = anatomy.generate(name, [{"role": "user", "content": PROMPT}], max_new_tokens=max_new_tokens)
    return r.text


@pytest.mark.parametrize("form", _forms({"installed"}))
def test_generate(form, decoder_forms, capsys):
    name = decoder_forms[form]
    code, out, err = _run(capsys, "generate", PROMPT, "--model", name, "--max-new-tokens", "4")
    if form in WITHOUT_WEIGHTS:
        return _refused(code, err, "generate", name)
    assert code == 0, err
    assert out == _greedy(name) + "\n"


@pytest.mark.parametrize("form", _forms({"installed"}))
def test_chat(form, decoder_forms, capsys, monkeypatch):
    name = decoder_forms[form]
    monkeypatch.setattr("sys.stdin", io.StringIO(PROMPT + "\n"))
    code, out, err = _run(capsys, "chat", "--model", name, "--max-new-tokens", "4")
    if form in WITHOUT_WEIGHTS:
        return _refused(code, err, "chat", name)
    assert code == 0, err
    assert out == _greedy(name) + "\n"


@pytest.mark.parametrize("form", _forms({"installed"}))
def test_attention(form, decoder_forms, capsys):
    name = decoder_forms[form]
    code, out, err = _run(capsys, "attention", "--model", name, "The cat sat.", "--layer", "1", "--head", "0")
    if form in WITHOUT_WEIGHTS:
        return _refused(code, err, "attention", name)
    assert code == 0, err
    tokens = len(anatomy.load_tokenizer(name).encode("The cat sat."))
    assert f"self-attention, layer 1, head 0 ({tokens} x {tokens} tokens)" in " ".join(out.split())  # a wrapped title


@pytest.mark.parametrize("form", FORMS)
def test_embed(form, encoder_forms, capsys):
    name = encoder_forms[form]
    code, out, err = _run(capsys, "embed", "--model", name, "A man is eating food.", "--json")
    if form in WITHOUT_WEIGHTS:
        return _refused(code, err, "embed", name)
    if form == "gguf":  # a decoder's file: weights, but no encoder
        assert code == 2 and err.count("\n") == 1 and "embeddings need an encoder model" in err
        return
    assert code == 0, err
    vector = torch.tensor(json.loads(out)["embeddings"][0]["embedding"])
    assert torch.allclose(vector, anatomy.embed("all-minilm-l6-v2", ["A man is eating food."])[0], atol=1e-6)


@pytest.mark.parametrize("form", _forms({"installed"}))
def test_serve(form, decoder_forms, capsys):
    """Refused forms fail before the port is bound; the others answer as the engine does."""
    from ..serving.conftest import Server, free_port

    name = decoder_forms[form]
    if form in WITHOUT_WEIGHTS:
        code, _, err = _run(capsys, "serve", "--model", name, "--port", str(free_port()))
        assert err.startswith("anatomy serve: error: --model: ")
        return _refused(code, err, "serve", name)
    server = Server("--model", name, "--embedding-model", "none", "--kv-memory", "64MiB")
    try:
        body = json.dumps({"model": name, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4,
                           "temperature": 0}).encode()
        request = urllib.request.Request(f"{server.url}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            answer = json.loads(r.read())
    finally:
        server.close()
    assert answer["model"] == name and answer["choices"][0]["message"]["content"] == _greedy(name)


# -- training: a fresh model from a preset or config, a checkpoint fine-tuned ----------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("The quick brown fox jumps over the lazy dog. " * 40, encoding="utf-8")
    return path


@pytest.mark.parametrize("form", _forms({"installed"}))
def test_train(form, decoder_forms, corpus, tmp_path, capsys):
    """One step at a learning rate too small to move a weight: a fine-tuned checkpoint keeps its
    weights, a fresh model from a preset or a config has the config's shape and the tokenizer's vocabulary."""
    name, out = decoder_forms[form], tmp_path / "run"
    fresh = form in WITHOUT_WEIGHTS
    tokenizer = "chars" if fresh else name
    shape = ["--n-layers", "1", "--d-model", "32", "--n-heads", "2", "--d-ff", "64"] if form == "preset" else []
    code, _, err = _run(capsys, "train", "--data", str(corpus), "--tokenizer", tokenizer, "--model", name, *shape,
                        "--steps", "1", "--batch-size", "2", "--seq-len", "16", "--lr", "1e-12", "--warmup", "0",
                        "--eval-steps", "1", "--out", str(out), "--quiet")
    assert code == 0, err
    config = json.loads((out / "run.json").read_text())["config"]
    trained = anatomy.load(out / "checkpoints" / "step-000001")
    if fresh:
        chars = anatomy.load_tokenizer(out / "checkpoints" / "step-000001")
        assert config["vocab_size"] == chars.vocab_size and config["d_model"] == 32
        return
    source = anatomy.load(name, weights="f32")
    assert config == source.config.to_dict()
    before, after = source.state_dict(), trained.state_dict()
    assert all(torch.allclose(before[k].float(), after[k].float(), atol=1e-6) for k in before)
