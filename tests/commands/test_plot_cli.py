"""`anatomy plot`'s bad inputs: one line naming the file or option, exit 2, and no file written."""

from __future__ import annotations

import json

import pytest

from anatomy.cli import main


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": s, "loss": 4.0 - s / 50} for s in range(1, 11)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


@pytest.mark.parametrize("make, args, message", [
    (None, ["-o", "OUT/loss.xyz"], "--output OUT/loss.xyz: .xyz is not an image format matplotlib writes"),
    (None, ["-o", "OUT/loss.png", "--smooth", "0"], "--smooth 0 must be a positive integer"),
    (None, ["-o", "OUT"], "OUT: cannot write it: a directory is in the way"),
    (("latin1", b"\xff\xfe{\n"), ["-o", "OUT/loss.png"], "metrics.jsonl: not UTF-8 text (byte 0"),
    (("junk", b'3\n"text"\n{"loss": 2}\n[1, 2]\n{"step": "1", "loss": 2}\n'), ["-o", "OUT/loss.png"],
     "metrics.jsonl: holds no training steps yet"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, run, make, args, message):
    if make is not None:
        run = tmp_path / make[0]
        run.mkdir()
        (run / "metrics.jsonl").write_bytes(make[1])
    out = tmp_path / "out"
    out.mkdir()
    assert main(["plot", str(run), *[a.replace("OUT", str(out)) for a in args]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("anatomy plot: error: ")
    assert message.replace("OUT", str(out)) in err
    assert list(out.iterdir()) == []  # nothing written, not even a temporary file


def test_other_formats_by_suffix(tmp_path, run):
    assert main(["plot", str(run), "-o", str(tmp_path / "loss.svg")]) == 0
    assert (tmp_path / "loss.svg").read_text().lstrip().startswith("<?xml")
