"""The command line's error contract: bad input is one line and exit 2; a bug is a bug (its
traceback, a request to report it, exit 1), never dressed up as bad input."""

from __future__ import annotations

import pytest

from anatomy import cli
from anatomy.commands import presets
from anatomy.errors import ConfigError


def _run_raising(monkeypatch, capsys, exc: BaseException) -> tuple[int, str]:
    def run(args):
        raise exc

    monkeypatch.setattr(presets, "run", run)
    code = cli.main(["presets"])
    return code, capsys.readouterr().err


def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys):
    code, err = _run_raising(monkeypatch, capsys, ConfigError("d_model=500 is not divisible by n_heads=12"))
    assert code == 2
    assert err == "anatomy presets: error: d_model=500 is not divisible by n_heads=12\n"


def test_a_refused_path_is_one_line_and_exit_2(monkeypatch, capsys):
    code, err = _run_raising(monkeypatch, capsys, PermissionError(13, "Permission denied", "/root/out.png"))
    assert code == 2
    assert err == "anatomy presets: error: /root/out.png: Permission denied\n"


@pytest.mark.parametrize("bug", [ValueError("a plain ValueError from a bug"), KeyError("missing"),
                                 ZeroDivisionError("division by zero"), OSError("no file involved")])
def test_a_bug_keeps_its_traceback_and_asks_for_a_report(monkeypatch, capsys, bug):
    code, err = _run_raising(monkeypatch, capsys, bug)
    assert code == 1
    assert "Traceback (most recent call last)" in err and type(bug).__name__ in err
    assert "this is a bug in anatomy" in err and "please report it" in err


def test_ctrl_c_exits_130(monkeypatch, capsys):
    code, _ = _run_raising(monkeypatch, capsys, KeyboardInterrupt())
    assert code == 130


def test_a_command_line_argparse_refuses_is_one_line_and_exit_2(capsys):
    assert cli.main(["presets", "--bogus"]) == 2
    assert capsys.readouterr().err == ("anatomy presets: error: unrecognized arguments: --bogus "
                                       "(`anatomy presets --help` lists the options)\n")
    assert cli.main(["generate", "hi", "--top-k", "many"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --top-k: invalid int value: 'many'" in err
    assert cli.main(["no-such-command"]) == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


def _raise_a_bug(*args, **kwargs):
    raise ValueError("a plain ValueError deep inside anatomy")


# each command with a function it calls made to fail like a bug would: the command must not turn it
# into a one-line "error" (nothing between the CLI and the bug catches a plain ValueError)
DEEP_BUGS = [
    (["generate", "hi"], "anatomy.inference.loading", "load_named"),
    (["chat"], "anatomy.inference.loading", "load_named"),
    (["embed", "a text"], "anatomy.inference.embed", "load_embedder"),
    (["inspect", "--model", "gpt2"], "anatomy.analysis.report", "build_report"),
    (["compare", "gpt2", "llama-7b"], "anatomy.analysis.report", "build_report"),
    (["train", "--data", "DATA", "--out", "OUT"], "anatomy.commands.train", "prepare"),
    (["plot", "RUN"], "anatomy.commands.plot", "plot_losses"),
    (["presets"], "anatomy.commands.presets", "build_model"),
]


@pytest.mark.parametrize("argv, module, name", DEEP_BUGS, ids=[argv[0] for argv, *_ in DEEP_BUGS])
def test_a_bug_deep_in_any_command_keeps_its_traceback(monkeypatch, capsys, tmp_path, argv, module, name):
    import importlib

    data = tmp_path / "text.txt"
    data.write_text("some text\n")
    monkeypatch.setattr(importlib.import_module(module), name, _raise_a_bug)
    paths = {"DATA": str(data), "OUT": str(tmp_path / "run"), "RUN": str(tmp_path)}
    assert cli.main([paths.get(a, a) for a in argv]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "a plain ValueError deep inside anatomy" in err
    assert "this is a bug in anatomy" in err
