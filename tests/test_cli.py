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
