"""The prompts of `python -m benchmarks speculative` (and the real-model speculative tests).

Input-grounded tasks copy from their context: a passage of Lewis Carroll's "Alice's Adventures in
Wonderland" (1865, public domain; chapter I, as Project Gutenberg's text #11 has it) rewritten with
another name or with its spelling mistakes corrected, and a small Python module with a variable
renamed. Open-ended chat has nothing to copy from.

These are tasks SmolLM2-135M-Instruct really answers by copying (tried on it): asked to repeat the
whole passage word for word, to quote from it or to answer from it, it paraphrases or tells its own
story instead, and a prompt-lookup proposer has nothing to find.
"""

from __future__ import annotations

ALICE = (
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do: "
    "once or twice she had peeped into the book her sister was reading, but it had no pictures or conversations "
    "in it, \u201cand what is the use of a book,\u201d thought Alice \u201cwithout pictures or conversations?\u201d\n\n"
    "So she was considering in her own mind (as well as she could, for the hot day made her feel very sleepy and "
    "stupid), whether the pleasure of making a daisy-chain would be worth the trouble of getting up and picking "
    "the daisies, when suddenly a White Rabbit with pink eyes ran close by her.\n\n"
    "There was nothing so very remarkable in that; nor did Alice think it so very much out of the way to hear the "
    "Rabbit say to itself, \u201cOh dear! Oh dear! I shall be late!\u201d (when she thought it over afterwards, it "
    "occurred to her that she ought to have wondered at this, but at the time it all seemed quite natural); but "
    "when the Rabbit actually took a watch out of its waistcoat-pocket, and looked at it, and then hurried on, "
    "Alice started to her feet, for it flashed across her mind that she had never before seen a rabbit with "
    "either a waistcoat-pocket, or a watch to take out of it, and burning with curiosity, she ran across the "
    "field after it, and fortunately was just in time to see it pop down a large rabbit-hole under the hedge.\n\n"
    "In another moment down went Alice after it, never once considering how in the world she was to get out "
    "again.\n\n"
    "The rabbit-hole went straight on like a tunnel for some way, and then dipped suddenly down, so suddenly that "
    "Alice had not a moment to think about stopping herself before she found herself falling down a very deep "
    "well."
)


PARAGRAPHS = ALICE.split("\n\n")
MISSPELT = PARAGRAPHS[0].replace("beginning", "begining").replace("sister", "sistr", 1).replace("pictures", "pictrues", 1)
CODE = """def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for value in values:
        total += (value - m) ** 2
    return total / len(values)
"""


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


GROUNDED = {
    "copy-edit": user("Rewrite this text with Mary instead of Alice:\n\n" + "\n\n".join(PARAGRAPHS[:2])),
    "fix-typos": user("Correct the spelling mistakes in this text:\n\n" + MISSPELT),
    "code-edit": user("Rename the variable `total` to `acc` in this Python code and show the whole code:\n\n"
                      "```python\n" + CODE + "```"),
}

CHAT = {
    "story": user("Write a short story about a dragon who learns to cook."),
    "advice": user("What are some good ways to stay focused while studying?"),
    "explain": user("Explain how a rainbow forms."),
}
