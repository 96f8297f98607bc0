"""`anatomy chat`, run as the real console script in a subprocess with its stdin piped."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import threading
import time

import pytest

from anatomy.cli import main

from .test_generate_cli import ANATOMY


@pytest.mark.slow
def test_conversation_with_reset_and_exit():
    script = "What is the capital of France?\n/reset\n/bogus\nWhat is the capital of France?\n/exit\nnever read\n"
    out = subprocess.run([ANATOMY, "chat", "--max-new-tokens", "40"], input=script.encode(), capture_output=True,
                         timeout=300)
    stdout, stderr = out.stdout.decode(), out.stderr.decode()
    assert out.returncode == 0, stderr
    assert stdout.count("Paris") == 2  # the same answer after /reset: the history really was cleared
    assert "[conversation reset]" in stderr and "unknown command '/bogus'" in stderr and "Traceback" not in stderr


@pytest.mark.slow
def test_ctrl_c_stops_a_reply_without_leaving():
    proc = subprocess.Popen([ANATOMY, "chat", "--max-new-tokens", "4000", "--ignore-eos"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_ctrl_c_default)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read1(4096), b"")), daemon=True)
    reader.start()
    proc.stdin.write(b"Tell me a very long story about a dragon.\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 240
    while not chunks and time.monotonic() < deadline:  # wait until the reply is streaming
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    proc.stdin.write(b"/reset\n/exit\n")  # still chatting: the next commands are read and obeyed
    proc.stdin.flush()
    stderr = proc.communicate(timeout=120)[1].decode()
    reader.join(timeout=10)
    assert proc.returncode == 0, stderr
    assert "[stopped]" in stderr and "[conversation reset]" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("args, stdin, message", [
    (["--dtype", "f8"], b"", "--dtype 'f8' is not one of f32, f16, bf16"),
    (["--temperature", "-1"], b"", "temperature=-1.0 must be >= 0"),
    (["--model", "no-such-model"], b"", "'no-such-model' is neither an existing file"),
    (["--model", "all-minilm-l6-v2"], b"", "all-minilm-l6-v2 has no chat template"),
    ([], b"caf\xe9 au lait\n", "stdin is not valid UTF-8: byte 0xe9"),
])
def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, args, stdin, message):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    assert main(["chat", "--max-new-tokens", "4", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("anatomy chat: error: ") and message in err


def test_ctrl_c_stops_a_reply_even_where_its_exception_was_swallowed(monkeypatch, capsys):
    """A real SIGINT lands inside code that catches KeyboardInterrupt and goes on: the reply still stops
    at its next token, keeps what was shown, and Ctrl-C's handler is the one it was before."""
    from anatomy.commands import chat

    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python has it in a terminal

    def deltas():
        yield 0, "Once"
        try:
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.01)  # the handler runs here, and its KeyboardInterrupt is swallowed
        except KeyboardInterrupt:
            pass
        yield 0, " upon"
        yield 0, " a time"  # never asked for

    class Gen:
        def deltas(self):
            return deltas()

    monkeypatch.setattr(chat, "start", lambda *args: Gen())
    before = signal.getsignal(signal.SIGINT)
    try:
        assert chat._reply(None, None, [{"role": "user", "content": "Hi"}], chat.argparse.Namespace(system=None)) \
            == "Once upon"
        out, err = capsys.readouterr()
        assert out == "Once upon" and err == " [stopped]\n"
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, outer)


def _ctrl_c_default() -> None:
    """A chat started from a shell that ignores Ctrl-C in background jobs gets the terminal's default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
