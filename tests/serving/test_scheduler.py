"""The scheduler's policy, on sequences without a model: budgets, chunked prefill, admission,
prefix hits, preemption."""

from __future__ import annotations

from anatomy.inference.sampling import SamplingParams
from anatomy.text.stops import StopStringFilter, TextRow
from anatomy.serving.blocks import BlockManager
from anatomy.serving.scheduler import Scheduler
from anatomy.serving.sequence import Sequence, Status


def seq(n: int, first: int = 1) -> Sequence:
    return Sequence(tokens=list(range(first, first + n)), prompt_len=n, params=SamplingParams(),
                    text=TextRow(None, StopStringFilter()), sink=lambda e: None)


def run_step(s: Scheduler) -> dict[int, int]:
    """Schedule, pretend the forward ran: sequences at their end get one new token."""
    plan = s.schedule()
    for q, n in plan:
        s.advance(q, n)
        if q.computed == len(q.tokens):
            q.tokens.append(0)
    return {id(q): n for q, n in plan}


def test_chunked_prefill_never_takes_the_decodes_turn():
    s = Scheduler(BlockManager(64, 4), max_seqs=8, max_step_tokens=8)
    a = seq(3)
    s.add(a)
    assert run_step(s) == {id(a): 3}  # a: prefilled, first token sampled
    long = seq(30, first=100)
    s.add(long)
    steps = [run_step(s) for _ in range(4)]
    assert all(step[id(a)] == 1 for step in steps), "the decoding sequence advances every step"
    assert [step.get(id(long)) for step in steps] == [7, 7, 7, 7], "the long prompt gets what the budget leaves"
    assert long.computed == 28 and len(long.tokens) == 30


def test_fcfs_admission_and_max_seqs():
    s = Scheduler(BlockManager(64, 4), max_seqs=2, max_step_tokens=100)
    a, b, c = seq(5), seq(5, 10), seq(5, 20)
    for q in (a, b, c):
        s.add(q)
    first = run_step(s)
    assert set(first) == {id(a), id(b)} and c.status is Status.WAITING
    s.finish(a)
    assert a.blocks == [] and a.status is Status.FINISHED
    assert set(run_step(s)) == {id(b), id(c)}, "a finished sequence's slot is taken at the next step"


def test_prefix_hit_skips_the_cached_blocks_but_recomputes_the_last_token():
    m = BlockManager(64, 4)
    s = Scheduler(m, max_seqs=8, max_step_tokens=100)
    a = seq(12)
    s.add(a)
    run_step(s)
    s.finish(a)
    b = seq(12)  # the same 12 tokens: 3 full blocks cached, the last one is recomputed
    s.add(b)
    assert run_step(s) == {id(b): 4}
    assert b.computed == 12 and len(b.tokens) == 13 and m.hit_tokens == 8 and m.queried_tokens == 24
    c = seq(14)  # 12 shared + 2: all three full blocks hit
    s.add(c)
    assert run_step(s) == {id(b): 1, id(c): 2}
    assert m.hit_tokens == 8 + 12


def test_preemption_frees_the_newest_and_recomputes_it_later():
    m = BlockManager(4, 2)  # 8 token slots
    s = Scheduler(m, max_seqs=4, max_step_tokens=100, prefix_caching=False)
    a, b = seq(2), seq(2, 10)
    s.add(a)
    s.add(b)
    for _ in range(3):  # prefill, then two decode steps: 4 tokens computed each, 2 blocks each, none free
        run_step(s)
    assert m.free == 0 and a.computed == b.computed == 4 and len(a.tokens) == 5
    step = run_step(s)  # a's fifth token needs a third block: b (admitted last) is preempted
    assert step == {id(a): 1} and b.status is Status.WAITING and b.computed == 0 and b.blocks == []
    assert s.preemptions == 1 and list(s.waiting) == [b] and len(b.tokens) == 5, "b keeps what it generated"
    s.finish(a)
    assert run_step(s) == {id(b): 5}, "b's prompt and its generated tokens are computed again"


def test_watermark_keeps_a_block_per_running_sequence():
    m = BlockManager(4, 2)
    s = Scheduler(m, max_seqs=4, max_step_tokens=100, prefix_caching=False)
    a = seq(3)
    s.add(a)
    run_step(s)  # a holds 2 blocks
    b = seq(3, 10)  # would take the last 2 and leave a no block to grow into
    s.add(b)
    assert id(b) not in run_step(s) and b.status is Status.WAITING


def ranked(n: int, first: int, priority: int) -> Sequence:
    q = seq(n, first)
    q.priority = priority
    return q


def test_priority_admits_by_priority_then_arrival():
    s = Scheduler(BlockManager(64, 4), max_seqs=2, max_step_tokens=100, policy="priority")
    a, b, c = ranked(5, 1, 1), ranked(5, 10, 0), ranked(5, 20, 0)
    for q in (a, b, c):
        s.add(q)
    assert list(s.waiting) == [b, c, a]
    assert set(run_step(s)) == {id(b), id(c)} and a.status is Status.WAITING


def test_priority_preempts_the_worst_running_sequence_for_a_slot():
    s = Scheduler(BlockManager(64, 4), max_seqs=2, max_step_tokens=100, policy="priority")
    low, lower = ranked(5, 1, 1), ranked(5, 10, 2)
    s.add(lower)
    s.add(low)
    run_step(s)
    assert s.running == [low, lower], "running in rank order, the worst last"
    high = ranked(5, 20, 0)
    s.add(high)
    step = run_step(s)
    assert step == {id(low): 1, id(high): 5}, "the worst-ranked one gave its slot"
    assert lower.status is Status.WAITING and lower.blocks == [] and s.preemptions == 1
    equal = ranked(5, 30, 1)  # ranks below low (a later arrival): waits, preempts nothing
    s.add(equal)
    assert run_step(s) == {id(low): 1, id(high): 1} and s.preemptions == 1
    assert list(s.waiting) == [equal, lower]


def test_priority_preempts_the_worst_running_sequence_for_blocks():
    m = BlockManager(6, 2)
    s = Scheduler(m, max_seqs=8, max_step_tokens=100, prefix_caching=False, policy="priority")
    low, lower = ranked(4, 1, 1), ranked(4, 10, 2)
    s.add(lower)
    s.add(low)
    run_step(s)  # 2 blocks each, 2 free: a third sequence of 4 tokens would leave none spare
    high = ranked(4, 20, 0)
    s.add(high)
    assert run_step(s) == {id(low): 1, id(high): 4} and lower.status is Status.WAITING
    # growing past the blocks preempts by rank, not by admission: low (admitted before high) goes
    for _ in range(2):
        run_step(s)
    assert s.running == [high] and low.status is Status.WAITING and list(s.waiting) == [low, lower]


def test_fcfs_is_the_default_and_an_unknown_policy_is_refused():
    import pytest

    from anatomy.errors import InputError

    assert Scheduler(BlockManager(4, 2), max_seqs=1, max_step_tokens=8).policy == "fcfs"
    with pytest.raises(InputError, match="lifo"):
        Scheduler(BlockManager(4, 2), max_seqs=1, max_step_tokens=8, policy="lifo")
