"""Prompt lookup (n-gram) proposals: no model, only the text so far.

If the sequence (prompt and output) ends with an n-gram that occurred before, the tokens that
followed that earlier occurrence are a good guess for what follows now: a summary, an edit or an
answer quoting its context copies whole runs of the prompt. This is HF transformers'
`prompt_lookup_num_tokens` and vLLM's ngram proposer; here the longest n (max_n down to min_n)
with an earlier occurrence wins, and of its occurrences the latest.

    the cat sat on the mat . the dog sat on | the mat .
    the ending "dog sat on" (n = 3) never occurred before; "sat on" (n = 2) did, followed by
    "the mat ." -> proposed
"""

from __future__ import annotations

from anatomy.errors import InputError


class NgramIndex:
    """One token sequence and, for every n-gram of it (min_n <= n <= max_n), the last position an
    occurrence ends at. A token's own n-grams are indexed when the next token arrives, so looking
    up the sequence's ending finds only an earlier occurrence. Appending costs O(max_n)."""

    def __init__(self, tokens: list[int], *, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self._index(len(self.tokens) - 1)
            self.tokens.append(token)

    def _index(self, end: int) -> None:
        for n in range(self.min_n, min(self.max_n, end + 1) + 1):
            self.ends[tuple(self.tokens[end - n + 1:end + 1])] = end

    def continuation(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching ending."""
        seq = self.tokens
        for n in range(min(self.max_n, len(seq)), self.min_n - 1, -1):
            end = self.ends.get(tuple(seq[-n:]))
            if end is not None:
                out: list[int] = []
                for i in range(k):  # a continuation that runs into the ending copies itself on
                    j = end + 1 + i
                    out.append(seq[j] if j < len(seq) else out[j - len(seq)])
                return out
        return []


class NgramProposer:
    """Prompt lookup for SpeculativeDecoder: each sequence guesses with an NgramIndex of its own."""

    name = "ngram"
    free = True

    def __init__(self, *, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise InputError(f"n-gram sizes min_n={min_n}, max_n={max_n} need 1 <= min_n <= max_n")
        self.max_n, self.min_n = max_n, min_n

    def guesser(self, tokens: list[int]) -> NgramIndex:
        """One sequence's guesser, over its prompt `tokens`."""
        return NgramIndex(tokens, min_n=self.min_n, max_n=self.max_n)
