"""The docs are tests: every shell command and Python snippet in README.md and docs/*.md that is
marked runnable runs here, as a user would paste it, on small inputs, and must succeed.

How a block is marked: the line just before its fence is an HTML comment (GitHub does not show it).

    <!-- runnable -->                       every command (```sh) or the snippet (```python) runs
    <!-- runnable slow -->                  the same, in a test marked slow
    <!-- runnable; except anatomy train ...: why -->    lines starting with these (comma-separated)
                                                        do not run; the reason says where they do
    <!-- not runnable: why -->              never run (a benchmark, the setup itself, ...)

Every ```sh and ```python block must be marked one way or the other (an unmarked one fails
here, so that a new command cannot slip past); blocks without a language are output, figures or
diagrams and are never run. Each shell block runs in a folder of its own; the Python snippets of
a file run in order in one interpreter and one folder (a notebook's cells).

The folder holds what the docs name as placeholders: path/to/hf_dir (a tiny random LLaMA-style
model with SmolLM2's tokenizer), model.gguf, path/to/model.gguf and other.gguf (the same model
as GGUF), path/to/bert-dir (all-MiniLM-L6-v2), data/shakespeare.txt (tests/data/english.txt
standing in for the corpus `make data/shakespeare.txt` fetches) and tests/data/english.txt itself;
examples/ is the repository's.

Small inputs: the options of SMALL are appended to each `anatomy` command of that name (argparse
keeps the last value), e.g. --max-new-tokens 16 for generate and --steps 2 for train (and SCRIPTS' to the example scripts), so the
documented options are all parsed and used and only the amount of work shrinks. `anatomy serve`
is started in the background on a free port (each port a block names, 8000 by default, is mapped
to a free one, in its URLs too), used by the block's later lines and stopped at the block's end.
Every other command gets "Hello" on stdin (what `anatomy chat` answers before its input ends).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import tiny_chat_model
from .serving.conftest import wait_until_ready

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = ("sh", "python")
SMALL = {
    "generate": ["--max-new-tokens", "16"],
    "chat": ["--max-new-tokens", "16"],
    "profile": ["--prompt-len", "16", "--new-tokens", "4"],
    "perplexity": ["--max-tokens", "600"],
    "train": ["--steps", "2", "--eval-steps", "1", "--warmup", "1"],
    "serve": ["--kv-memory", "64MiB"],
    "bench-serve": ["--requests", "4", "--max-tokens", "8"],
}
SCRIPTS = {  # (a script, its subcommand or None): options appended, as SMALL's
    ("examples/training/sample.py", None): ["--tokens", "16"],
    ("examples/training/number_words.py", "score"): ["--limit", "20"],
}
COMMAND_TIMEOUT_S = 600
MARK = re.compile(r"<!--\s*(?P<kind>runnable|not runnable)(?P<rest>.*?)-->")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
PUNCTUATION = {"|", "||", "&&", ";", "&"}


@dataclass
class Block:
    """A fenced block: where it starts, its language, its text and its mark."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    mark: str | None  # "runnable", "not runnable" or None (unmarked)
    slow: bool = False
    skip: tuple[str, ...] = ()  # line prefixes that do not run
    why: str = ""

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the mark on the line before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        block = Block(path, i + 1, fence["lang"], "\n".join(lines[i + 1:end]) + "\n", None)
        if i and (mark := MARK.fullmatch(lines[i - 1].strip())):
            _read_mark(block, mark)
        out.append(block)
        i = end + 1
    return out


def _read_mark(block: Block, mark: re.Match) -> None:
    block.mark, rest = mark["kind"], mark["rest"].strip()
    if block.mark == "not runnable":
        block.why = rest.removeprefix(":").strip()
        return
    block.slow = rest.startswith("slow")
    if (found := re.search(r";\s*except\s+(?P<lines>[^:]+):\s*(?P<why>.+)", rest)) is not None:
        block.skip = tuple(p.strip() for p in found["lines"].split(","))
        block.why = found["why"].strip()


def _all_blocks() -> list[Block]:
    return [b for path in DOCS for b in blocks(path)]


def test_every_command_block_is_marked():
    unmarked = [b.where for b in _all_blocks() if b.lang in LANGUAGES and b.mark is None]
    assert unmarked == [], f"mark these blocks <!-- runnable --> or <!-- not runnable: why -->: {unmarked}"
    no_reason = [b.where for b in _all_blocks() if (b.mark == "not runnable" or b.skip) and not b.why]
    assert no_reason == [], f"say why these blocks (or lines) do not run: {no_reason}"
    other = [b.where for b in _all_blocks() if b.mark is not None and b.lang not in LANGUAGES]
    assert other == [], f"only ```sh and ```python blocks run; these are marked but are neither: {other}"


def test_the_marks_are_read(tmp_path):
    """The parser itself, on a made-up document."""
    doc = textwrap.dedent("""\
        <!-- runnable slow; except anatomy serve, anatomy train ...: a server (docs/serving.md) -->
        ```sh
        anatomy presets
        ```
        <!-- not runnable: a benchmark -->
        ```python
        pass
        ```
        ```
        output
        ```
        """)
    path = tmp_path / "doc.md"
    path.write_text(doc, encoding="utf-8")
    first, second, third = blocks(path)
    assert (first.mark, first.slow, first.skip, first.lang) == ("runnable", True, ("anatomy serve", "anatomy train ..."),
                                                                "sh")
    assert (second.mark, second.why, third.mark, third.lang) == ("not runnable", "a benchmark", None, "")
    assert _commands("a \\\n  'b c'  # note\n\necho x | d\n") == [["a", "b c"], ["echo", "x", "|", "d"]]
    shell = Shell(tmp_path)
    small = _small(["OMP_NUM_THREADS=1", "anatomy", "generate", "hi there", "--max-new-tokens", "100"], shell)
    assert small == "OMP_NUM_THREADS=1 anatomy generate 'hi there' --max-new-tokens 100 --max-new-tokens 16"
    served = _small(["anatomy", "serve"], shell)
    assert served == f"anatomy serve --kv-memory 64MiB --port {shell.ports['8000']}"
    assert _small(["anatomy", "bench-serve", "--url", "http://127.0.0.1:8000"], shell).startswith(
        f"anatomy bench-serve --url http://127.0.0.1:{shell.ports['8000']} --requests 4")


# -- running a file's blocks -----------------------------------------------------------------------

def _files() -> list:
    params = []
    for path in DOCS:
        runnable = [b for b in blocks(path) if b.mark == "runnable" and b.lang in LANGUAGES]
        if runnable:
            marks = [pytest.mark.slow] if any(b.slow for b in runnable) else []
            params.append(pytest.param(path, id=str(path.relative_to(ROOT)), marks=marks))
    return params


@pytest.mark.parametrize("path", _files())
def test_the_runnable_blocks_run(path, placeholders, tmp_path):
    python = None
    try:
        for block in blocks(path):
            if block.mark != "runnable" or block.lang not in LANGUAGES:
                continue
            if block.lang == "sh":
                _run_shell(block, _sandbox(tmp_path / f"sh-{block.line}", placeholders))
            else:
                python = python or Interpreter(_sandbox(tmp_path / "python", placeholders))
                python.run(block)
    finally:
        if python is not None:
            python.close()


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory) -> Path:
    """The files the docs name as placeholders, made once (see the module docstring)."""
    from anatomy.checkpoints.registry import resolve

    root = tmp_path_factory.mktemp("placeholders")
    tiny_chat_model(root / "path" / "to" / "hf_dir", root / "model.gguf", d_model=64, max_seq_len=512)
    shutil.copy(root / "model.gguf", root / "path" / "to" / "model.gguf")
    shutil.copy(root / "model.gguf", root / "other.gguf")
    (root / "path" / "to" / "bert-dir").symlink_to(resolve("all-minilm-l6-v2"), target_is_directory=True)
    (root / "data").mkdir()
    shutil.copy(ROOT / "tests" / "data" / "english.txt", root / "data" / "shakespeare.txt")
    (root / "tests" / "data").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "data" / "english.txt", root / "tests" / "data" / "english.txt")
    return root


def _sandbox(folder: Path, placeholders: Path) -> Path:
    shutil.copytree(placeholders, folder, symlinks=True)
    (folder / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    return folder


def _env() -> dict[str, str]:
    """`anatomy` and `python` of this interpreter first on PATH; threads that sleep at barriers
    (on a shared 2-core machine spinning OpenMP threads slow each other down tenfold)."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "OMP_WAIT_POLICY": "PASSIVE"}


# -- shell ---------------------------------------------------------------------------------------

def _commands(text: str) -> list[list[str]]:
    """The block's commands as words (|, &&, ; as words of their own): continuation lines joined,
    comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [words for line in joined.splitlines() if (words := _words(line))]


def _words(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars="|&;")
    lex.whitespace_split, lex.commenters = True, "#"
    return list(lex)


def _line(words: list[str]) -> str:
    return " ".join(w if w in PUNCTUATION else shlex.quote(w) for w in words)


@dataclass
class Shell:
    """One block's run: its servers and the free port each documented port maps to."""

    folder: Path
    ports: dict[str, str] = field(default_factory=dict)
    servers: list[subprocess.Popen] = field(default_factory=list)


def _run_shell(block: Block, folder: Path) -> None:
    shell = Shell(folder)
    try:
        for words in _commands(block.text):
            if any(" ".join(words).startswith(p) for p in block.skip):
                continue
            command = _small(words, shell)
            if _subcommand(words) == "serve":
                shell.servers.append(_start_server(command, shell, block))
                continue
            out = subprocess.run(["bash", "-c", command], cwd=folder, env=_env(), input=b"Hello\n",
                                 capture_output=True, timeout=COMMAND_TIMEOUT_S)
            assert out.returncode == 0, (f"{block.where}: `{command}` exited with {out.returncode}:\n"
                                         f"{out.stderr.decode(errors='replace')[-3000:]}")
    finally:
        for server in shell.servers:
            _stop(server, block)


def _segments(tokens: list[str]) -> list[list[str]]:
    """The simple commands of a pipeline or list."""
    out, current = [], []
    for t in tokens:
        if t in PUNCTUATION:
            out.append(current)
            out.append([t])
            current = []
        else:
            current.append(t)
    return out + [current]


def _program(segment: list[str]) -> list[str]:
    """A simple command's words after its VAR=value assignments."""
    i = 0
    while i < len(segment) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", segment[i]):
        i += 1
    return segment[i:]


def _subcommand(words: list[str]) -> str | None:
    for segment in _segments(words):
        program = _program(segment)
        if len(program) >= 2 and program[0] == "anatomy":
            return program[1]
    return None


def _small(words: list[str], shell: Shell) -> str:
    """The command line with SMALL's options appended to each anatomy command and each documented
    port (--port N, 127.0.0.1:N; an anatomy serve without --port: 8000) mapped to a free one."""
    out = []
    for segment in _segments(words):
        program = _program(segment)
        if len(program) >= 2 and program[0] == "anatomy" and program[1] in SMALL:
            segment = segment + SMALL[program[1]]
            if program[1] == "serve" and "--port" not in segment:
                segment = segment + ["--port", "8000"]
            if program[1] == "bench-serve" and "--url" not in segment:
                segment = segment + ["--url", "http://127.0.0.1:8000"]
        if len(program) >= 2 and program[0] == "python":
            sub = program[2] if len(program) > 2 else None
            segment = segment + SCRIPTS.get((program[1], sub), SCRIPTS.get((program[1], None), []))
        out += segment
    for i, word in enumerate(out):
        if i and out[i - 1] == "--port":
            out[i] = _port(word, shell)
        out[i] = re.sub(r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{_port(m[1], shell)}", out[i])
    return _line(out)


def _port(documented: str, shell: Shell) -> str:
    if documented not in shell.ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            shell.ports[documented] = str(s.getsockname()[1])
    return shell.ports[documented]


def _start_server(command: str, shell: Shell, block: Block) -> subprocess.Popen:
    port = re.search(r"--port (\d+)", command)[1]
    log = open(shell.folder / f"serve-{port}.log", "w+b")
    proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=shell.folder, env=_env(), stdout=log,
                            stderr=subprocess.STDOUT)
    proc.log = log
    failure = wait_until_ready(proc, f"http://127.0.0.1:{port}", COMMAND_TIMEOUT_S)
    if failure is not None:
        proc.kill()
        raise AssertionError(f"{block.where}: `{command}`: {failure}:\n{_log(proc)}")
    return proc


def _stop(proc: subprocess.Popen, block: Block) -> None:
    if proc.poll() is None:
        proc.send_signal(2)  # Ctrl-C: the command's exit code 130
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log, code = _log(proc), proc.returncode
    proc.log.close()
    assert code in (0, 130), f"{block.where}: the server stopped with {code}:\n{log}"


def _log(proc: subprocess.Popen) -> str:
    proc.log.seek(0)
    return proc.log.read().decode(errors="replace")[-3000:]


# -- Python --------------------------------------------------------------------------------------

DRIVER = """
import json, sys, traceback
scope = {"__name__": "__main__"}
for line in sys.stdin:
    request = json.loads(line)
    try:
        exec(compile(request["code"], request["where"], "exec"), scope)
        answer = {"ok": True}
    except BaseException:
        answer = {"ok": False, "error": traceback.format_exc()[-4000:]}
    sys.stdout.flush()
    print("\\n\\0" + json.dumps(answer), flush=True)  # on a line of its own, whatever the snippet printed
"""


class Interpreter:
    """One Python process for a file's snippets: each runs in the scope the earlier ones left."""

    def __init__(self, folder: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-u", "-c", DRIVER], cwd=folder, env=_env(), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def run(self, block: Block) -> None:
        self.proc.stdin.write(json.dumps({"code": block.text, "where": block.where}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:  # the snippet's own output, then the answer
            if line.startswith("\0"):
                answer = json.loads(line[1:])
                assert answer["ok"], f"{block.where}: the snippet failed:\n{answer['error']}"
                return
        raise AssertionError(f"{block.where}: the interpreter ended (exit {self.proc.wait()})")

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
