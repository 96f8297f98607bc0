"""The files a reader must open to follow one decode step of `anatomy.stream`, counted as Python enters
them (sys.settrace: every function call, in any of the package's files) once the step is captured:
at most 10, the list in docs/architecture.md. The LM head is recorded in the graph with the blocks;
were it left eager, its layer, kernel binding and the model's head would add three files."""

from __future__ import annotations

import sys
from pathlib import Path

import anatomy

PACKAGE = Path(anatomy.__file__).parent
ARCHITECTURE = Path(__file__).parents[2] / "docs" / "architecture.md"
TRACED_PIECE = 40  # well after the 32 eager steps before a shape is captured (inference/engine/run.py)


def files_of_one_step(model, tokenizer) -> set[str]:
    """The package's files entered between two pieces of a stream, past the capture."""
    entered: set[str] = set()

    def tracer(frame, event, arg):
        path = frame.f_code.co_filename
        if path.startswith(str(PACKAGE)):
            entered.add(Path(path).relative_to(PACKAGE).as_posix())

    pieces = anatomy.stream(model, "Tell me a story about a cat.", tokenizer=tokenizer, max_new_tokens=TRACED_PIECE + 8,
                            ignore_eos=True)
    for i, _ in enumerate(pieces):
        if i == TRACED_PIECE:
            sys.settrace(tracer)
        elif i == TRACED_PIECE + 1:
            sys.settrace(None)
    sys.settrace(None)
    return entered


def test_a_captured_decode_step_enters_at_most_10_files(smollm2_gguf_path, smollm2_tokenizer, forced_timings):
    model = anatomy.load(smollm2_gguf_path)
    files = files_of_one_step(model, smollm2_tokenizer)
    assert "inference/engine/capture.py" in files, "the step was replayed from its captured graph"
    assert len(files) <= 10, "\n".join(sorted(files))
    listed = ARCHITECTURE.read_text(encoding="utf-8")
    assert all(f"`{name}`" in listed for name in files), "docs/architecture.md lists every file a step enters"
