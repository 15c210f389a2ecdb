"""Where the rank threads meet for a collective, with mismatch, deadlock and timeout checks.

Every participant (a rank, or one program of a rank under LNC 2) counts the collectives
it issues on each replica sub-group; the k-th call of every member of a sub-group meets
the k-th call of the others. The last one to arrive compares what everybody issued (op,
shapes, dtypes, parameters) and raises ``CollectiveMismatchError`` naming the ranks and
instructions when they differ. A member waiting on a peer that has already finished the
kernel, or a state where every live participant waits on a collective that cannot
complete (a deadlock), raise at once. A member also fails once the peers it waits for
have made no progress (issued no instruction) for ``timeout_s`` seconds: the timeout
measures a stall, not the wait, so long runs whose peers are busy simulating never time
out, while a peer stuck in kernel code (or sleeping) is reported after ``timeout_s``.

In a symmetric run (``run_ranks(symmetric=...)``) only representative participants run;
``exchange`` returns at once with every absent member's deposit taken to be the caller's
own (the peers are identical by assumption, see ``runner``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .errors import CollectiveMismatchError, SimulatorError, _Aborted
from .watchdog import debugging

Participant = tuple[int, int]  # (rank, program)


@dataclass
class Deposit:
    """What one participant brings to a collective."""

    who: Participant
    desc: str  # "all_gather(name='x')" for messages
    signature: tuple  # must be equal across the group
    payload: Any  # data and ready times, read by the peers


def _fmt(p: Participant) -> str:
    return f"rank {p[0]}" + (f" (program {p[1]})" if p[1] else "")


class Rendezvous:
    """Meeting point of all participants of one run."""

    POLL_S = 0.05
    DIVERGED_FACTOR = 2     # a peer's instructions while a waiter waits, over the waiter's before it arrived ...
    DIVERGED_MIN = 20_000   # ... plus this many, before the peer is taken to have skipped the collective

    def __init__(self, participants: list[Participant], timeout_s: float,
                 progress: Callable[[Participant], int] | None = None, symmetric: bool = False,
                 last: Callable[[Participant], str] | None = None) -> None:
        self._cond = threading.Condition()
        self._progress = progress
        self._last = last
        self.symmetric = symmetric
        self._alive = set(participants)
        self._participants = frozenset(participants)
        self._blocked: dict[Participant, tuple[tuple, str]] = {}
        self._pending: dict[tuple, dict[Participant, Deposit]] = {}
        self._done: dict[tuple, list] = {}
        self._seq: dict[tuple, int] = {}
        self.timeout_s = timeout_s
        self.error: BaseException | None = None

    def abort(self, exc: BaseException) -> None:
        with self._cond:
            if self.error is None:
                self.error = exc
            self._cond.notify_all()

    def is_blocked(self, who: Participant) -> bool:
        """True while ``who`` waits in a collective (read without the lock: a report only)."""
        return who in self._blocked

    def finish(self, who: Participant) -> None:
        with self._cond:
            self._alive.discard(who)
            self._cond.notify_all()

    def _fail(self, exc: SimulatorError) -> SimulatorError:
        if self.error is None:
            self.error = exc
        self._cond.notify_all()
        return exc

    def exchange(self, deposit: Deposit, members: tuple[Participant, ...],
                 on_complete: Callable[[dict[Participant, Deposit]], None] | None = None) -> dict[Participant, Deposit]:
        """Meet the other members of ``members`` at this participant's next call on that
        sub-group; return every member's deposit. ``on_complete`` runs once, by the last
        member to arrive, before any member leaves."""
        me = deposit.who
        if self.symmetric and not self._participants.issuperset(members):
            if self.error is not None:
                raise _Aborted()
            got = {m: deposit for m in members}
            if on_complete is not None:
                on_complete(got)
            return got
        with self._cond:
            if self.error is not None:
                raise _Aborted()
            sk = (me, members)
            k = self._seq.get(sk, 0)
            self._seq[sk] = k + 1
            key = (members, k)
            entry = self._pending.setdefault(key, {})
            entry[me] = deposit
            if len(entry) == len(members):
                del self._pending[key]
                self._check_match(entry, members, k)
                if on_complete is not None:
                    on_complete(entry)
                if len(members) > 1:
                    self._done[key] = [entry, len(members) - 1]
                self._cond.notify_all()
                return entry
            self._blocked[me] = (key, deposit.desc)
            # start of the current stall, peers' progress then, each missing peer's count and mine at arrival
            clock = [time.monotonic(), None, {}, self._progress(me) if self._progress else 0]
            checked = 0.0
            try:
                while key not in self._done:
                    if self.error is not None:
                        raise _Aborted()
                    # every completed collective wakes every waiter: the checks, which look at the
                    # other participants, run at most once per POLL_S per waiter, not once per wake
                    # (with 128 waiters that was 128 x 128 looks per ring step)
                    now = time.monotonic()
                    if now - checked >= self.POLL_S:
                        self._check_stuck(me, key, entry, members, deposit, clock)
                        checked = now
                    self._cond.wait(self.POLL_S)
            finally:
                self._blocked.pop(me, None)
            slot = self._done[key]
            slot[1] -= 1
            if slot[1] == 0:
                del self._done[key]
            return slot[0]

    def _check_match(self, entry: dict[Participant, Deposit], members: tuple[Participant, ...], k: int) -> None:
        sigs = {d.signature for d in entry.values()}
        if len(sigs) == 1:
            return
        ranks = [m[0] for m in members]
        lines = [f"  {_fmt(m)}: {entry[m].desc} {entry[m].signature}" for m in members]
        raise self._fail(CollectiveMismatchError(
            f"collective mismatch in replica group {ranks} (call #{k + 1} on that group): "
            f"the ranks issued different collectives or parameters:\n" + "\n".join(lines)))

    def _check_stuck(self, me: Participant, key: tuple, entry: dict, members: tuple,
                     deposit: Deposit, clock: list) -> None:
        ranks = [m[0] for m in members]
        missing = [m for m in members if m not in entry]
        gone = [m for m in missing if m not in self._alive]
        if gone:
            raise self._fail(CollectiveMismatchError(
                f"{_fmt(me)}, {deposit.desc}: waits in replica group {ranks} for "
                f"{', '.join(_fmt(m) for m in gone)}, which finished the kernel without issuing "
                f"a matching collective (call #{key[1] + 1} on that group)"))
        # a deadlock needs every live participant blocked: counted first, listed only then
        stuck = [] if len(self._blocked) < len(self._alive) else \
            [p for p in self._alive if p in self._blocked and self._blocked[p][0] not in self._done]
        if stuck and len(stuck) == len(self._alive):
            lines = [f"  {_fmt(p)} waits in {self._blocked[p][1]} on group {[m[0] for m in self._blocked[p][0][0]]}"
                     f" (call #{self._blocked[p][0][1] + 1})" for p in sorted(stuck)]
            raise self._fail(CollectiveMismatchError(
                "deadlock: every live rank waits on a collective that no peer will complete:\n"
                + "\n".join(lines)))
        now = time.monotonic()
        if self._progress is not None:
            counts = {m: self._progress(m) for m in missing}
            done = sum(counts.values())
            if done != clock[1]:
                clock[0], clock[1] = now, done  # a peer issued instructions: not a stall
            self._check_diverged(me, key, members, deposit, counts, clock)
        if now - clock[0] > self.timeout_s and debugging():
            clock[0] = now  # a peer stopped in a debugger is not stalled
        if now - clock[0] > self.timeout_s:
            raise self._fail(CollectiveMismatchError(
                f"{_fmt(me)}, {deposit.desc}: blocked for {now - clock[0]:.1f} s (timeout_s={self.timeout_s:g}) "
                f"in replica group {ranks} waiting for {', '.join(_fmt(m) for m in missing)}, which issued "
                f"no instruction in that time"))

    def _check_diverged(self, me: Participant, key: tuple, members: tuple, deposit: Deposit,
                        counts: dict[Participant, int], clock: list) -> None:
        """Fail when a missing peer keeps issuing instructions far past where it should have arrived."""
        start, mine = clock[2], clock[3]
        limit = self.DIVERGED_FACTOR * mine + self.DIVERGED_MIN
        for peer, count in counts.items():
            since = count - start.setdefault(peer, count)
            if since > limit:
                last = self._last(peer) if self._last is not None else "an unknown instruction"
                raise self._fail(CollectiveMismatchError(
                    f"{_fmt(me)}, {deposit.desc}: waits in replica group {[m[0] for m in members]} for "
                    f"{_fmt(peer)}, which has issued {since:,} instructions since without reaching this "
                    f"collective (call #{key[1] + 1} on that group; the waiter issued {mine:,} before it): it "
                    f"skipped the collective or took another path; its last instruction: {last}"))
