"""The quorum core: sans-I/O, time passed in (DESIGN §3).

Theory of operation
-------------------
Activity is Raft-style leadership with a leader lease, dressed in Solace's
roles. Each of the three nodes sends a heartbeat to both peers every
`heartbeat_interval_ms`; each heartbeat echoes the last sequence number the
sender heard from each peer. A echoing B's sequence number s tells B that the
round trip s made is complete; B remembers when it *sent* s.

Rules (numbers as in DESIGN §3):

R1 lease. An active node serves only while `now < lease_expiry`, where
   lease_expiry = (send time of its latest heartbeat, sent while active at this
   epoch, that a peer echoed) + lease_ms. The initial lease comes from the echo
   in the heartbeat that granted it the vote. Past expiry it steps down for good
   at that epoch. An echo carried by a heartbeat with a higher epoch never
   extends a lease: it makes the node step down (R3).

R2 takeover = election. A standby bids for epoch E = max(known, voted) + 1
   only when: no activity claim from its mate for lease_ms + margin, it sees a
   peer, and it is eligible (in sync with the last active, or provably the most
   up-to-date node, or forced by an operator who acknowledged data loss). It
   votes for itself (persisted) and needs one more vote: from the monitor, or
   from its mate at start-up. A voter grants at most one vote per epoch
   (persisted before the grant is sent), only when no node other than the
   candidate has claimed activity to it for lease_ms + margin, and only to an
   eligible candidate. The vote heartbeat must echo one of the candidate's
   recent sequence numbers; the candidate persists E, then serves.

   An "activity claim" from X, for the lease+margin rule, is: a heartbeat from
   X claiming ACTIVE; a vote we granted X; a bid from X for the epoch we voted
   X. A voter's or candidate's echo of X's heartbeat can extend X's lease only
   if that heartbeat was such a claim, so "no claim from X for lease+margin"
   proves every lease X could hold through us has expired.

R3 epochs fence. Every heartbeat carries the sender's epoch (the highest it
   knows of, including votes it granted). A node that sees a higher epoch than
   its own active epoch steps down at once and adopts it (persisted).

R4 start-up. A fresh boot neither bids nor votes for lease_ms + margin (its
   pre-crash echoes may still hold someone's lease). "Most up-to-date" is the
   order (spool epoch, spool seq, primary-first); a node proves it from its
   mate's heartbeat or from the monitor's view of the mate. Without proof it
   waits for an operator's forced bid.
R4' a tie with a mate that claimed activity (it was the active, and is silent now) counts as up to
   date for either role: the primary-first order only keeps two fresh nodes from bidding at once. A
   standby's position is what the active advertised while it held the standby in sync (what was
   released, every op of it on the standby); anything released alone is advertised first (R9) and
   would make the active's position higher. So a standby whose in-sync lease ran out while it stalled
   across the active's crash still takes over, and it holds every acknowledged message.

R5 every transition yields a `Decision` with a sentence saying why; its kind must be legal in the
   current activity, and only the decision changes it (the table in decisions.py).

R7 planned handover: the active stops serving, waits until its mate holds every op, then yields;
   an authenticated "yielded at epoch E" ends its claims at once (rules H1-H7 in handover.py).

R8 a state that cannot be saved is not acted on. The store raises OSError when
   a save fails (appliance/stable_file.py reserves its space, so a full disk is
   not such a failure; a failing disk is). Then no bid is made, no vote
   granted and no epoch activated, exactly as if the save had not been tried;
   what only lowers our claims (stepping down, adopting a higher epoch,
   copying a position) goes on in memory. One "storage" decision reports the
   failure and one its end; the node keeps running and retries on every turn.

R9 advertise before acknowledging alone. While the mate is out of sync and its in-sync lease has
   surely ended, the active acknowledges on local durability alone, so the survivor of its death must
   know how far it got. The active then advertises its durable position in its heartbeats (on disk
   first) and releases an acknowledgement only up to a position a peer echoed back in its view of us
   (`release_bound`). A peer that echoed it holds it: the mate then counts itself less up to date
   (R4 reads the higher of the mate's heartbeat and the monitor's view), and the monitor refuses its
   vote to a candidate behind it; a tie left for the primary can only be a true tie. One
   advertisement is in flight at a time (sent at once, answered at once by the peers, its echo asks
   for the next): a heartbeat round trip and a save per batch while redundancy is down, nothing
   while in sync (then the timer saves the position at most once a second: what a restart reads is
   older, so it claims less, never more).

R6 a stalled broker releases activity. The node's I/O runs heartbeats on their
   own thread, so a hung broker event loop would otherwise keep activity while
   serving nobody. The adapter reports when the broker loop last proved it was
   alive (`broker_alive`); once that is `broker_stall_ms` old, an active node
   steps down and a standby does not bid, so the mate takes over through R2.
   The bound sits far above any overload stall (those must never fail over).

Why at most one node serves (S1): two actives need two elections; each needs
two of three votes, and a voter that granted epoch E refuses every other
candidate until the E candidate's claims to it have been silent for
lease + margin, which is exactly when every lease that voter's echoes could
have granted is over. The simulator checks this over thousands of schedules.
"""

from __future__ import annotations

import collections
import dataclasses

from ..errors import LocalProtocolError
from ..roles import Role
from .auth import HeartbeatAuth, Rejected
from .decisions import DecisionKind, next_activity
from .handover import HandoverRules, HandoverState
from .insync import InSyncLease, MateSync
from .state import Decision, PersistentState, RedundancyStatus, StableStore, Timing  # noqa: F401 (re-exported)
from .wire import (FLAG_BID_FORCED, FLAG_MATE_IN_SYNC, FLAG_REDUNDANCY_UP, FLAG_SELF_IN_SYNC, FLAG_YIELDED, NEVER_MS,
                   Activity,
                   Heartbeat, PeerView)

POSITION_SAVE_MS = 1000  # in sync, our position is on disk at most this late (a restart claims less, never more)
SENT_HISTORY = 512  # our own send times kept for echo lookups (512 x 50 ms = 25 s)
DECISION_HISTORY = 64


@dataclasses.dataclass(slots=True)
class _Peer:
    role: Role
    hb: Heartbeat | None = None
    heard_at: int | None = None
    claim_at: int | None = None  # latest activity claim (see the theory above); boot time until one is seen
    claimed: bool = False  # claim_at is a real claim, not the boot-time stand-in
    echo_sent_at: int | None = None  # send time of our latest seq this peer echoed


class QuorumCore(HandoverRules):
    def __init__(self, role: Role, auth: HeartbeatAuth, timing: Timing, store: StableStore, now_ms: int) -> None:
        self.role = role
        self.auth = auth
        self.timing = timing
        self.store = store
        self.state = store.load()
        self.state.incarnation += 1
        store.save(self.state)
        auth.incarnation = self.state.incarnation  # the boot nonce a peer must echo (auth.py rule 6)

        self.activity = Activity.NONE if role is Role.MONITOR else Activity.STANDBY
        self.active_epoch = 0
        self.lease_expiry = 0
        self._activation_seq = 0
        self.mate_sync = MateSync(timing.insync_ms)  # active side
        self.insync = InSyncLease(timing.insync_ms)  # standby side
        self.bid_epoch = 0
        self._bid_forced = False
        self._force_until = 0
        self.config_version = 0
        self.handover = HandoverState()
        self.auto_revert = False  # group.auto_revert (H7)
        self._position_saved_at = 0
        self._position_unsaved = False  # in sync, a position copied in memory that the timer saves (R9's note)
        self._echoed_seq = -1  # R9: our highest position at this epoch a peer echoed back
        self.position_echoes = 0  # R9: how often _echoed_seq rose while alone (the adapter releases on a change)

        self.boot_at = now_ms
        self._broker_alive_at = now_ms  # R6: a fresh boot counts as a live broker
        self._hold_until = now_ms + timing.quiet_ms
        self.peers = {r: _Peer(r) for r in role.peers()}
        for peer in self.peers.values():
            peer.claim_at = now_ms  # R4: a fresh boot counts as having just heard a claim
        self._seq = 0
        self._sent: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._next_heartbeat_at = now_ms
        self._outbox: list[bytes] = []
        self._decisions: list[Decision] = []
        self.history: collections.deque[Decision] = collections.deque(maxlen=DECISION_HISTORY)
        self._last_refusal = ""
        self._bid_story = self._bid_eligibility = ""
        self.save_error: str | None = None  # R8: the latest failed save, until one succeeds
        self._now = now_ms
        self._decide(now_ms, DecisionKind.BOOT,
                     f"{role.value}: started, incarnation {self.state.incarnation}, "
                     f"epoch {self.state.epoch}; holding {timing.quiet_ms} ms before any bid or vote")

    # --- inputs ---------------------------------------------------------------

    def receive(self, data: bytes, now_ms: int) -> Heartbeat | None:
        self._now = now_ms
        self._expire(now_ms)
        try:
            hb = self.auth.open(data)
        except Rejected:
            return None
        answer = self._on_heartbeat(hb, now_ms)
        self._evaluate(now_ms)
        if answer and self.activity is not Activity.ACTIVE:
            self._send_heartbeat(now_ms)  # R9: the active alone releases once a peer echoes its position
        return hb

    def handle_timer(self, now_ms: int) -> None:
        self._now = now_ms
        self._expire(now_ms)
        self._evaluate(now_ms)
        if now_ms >= self._next_heartbeat_at:
            self._send_heartbeat(now_ms)
        if self._position_unsaved and now_ms - self._position_saved_at >= POSITION_SAVE_MS:
            self._save_position(now_ms)

    def broker_alive(self, alive_at_ms: int) -> None:
        """R6 input: the broker's event loop was running at `alive_at_ms` (same clock as now_ms)."""
        self._broker_alive_at = max(self._broker_alive_at, alive_at_ms)

    def broker_stalled_ms(self, now_ms: int) -> int:
        """How long the broker loop has been silent past the stall bound (0: not stalled)."""
        if not self.role.routes_messages:
            return 0
        age = now_ms - self._broker_alive_at
        return age if age >= self.timing.broker_stall_ms else 0

    def mate_link(self, now_ms: int, caught_up: bool, behind: str = "fell behind") -> None:
        """The mate link's word (active side): live, and the mate acknowledged every op whose effects were
        released; if not, `behind` says why (the decision's words). Losing it drops the mate from sync; regaining
        it re-admits the mate (docs/mate_link.md)."""
        self.mate_sync.caught_up = caught_up
        self.mate_sync.behind = behind
        if self.activity is not Activity.ACTIVE:
            return
        mate = self.role.mate()
        hb = self.peers[mate].hb
        if caught_up and not self.mate_sync.synced and hb is not None and self.sees(mate, now_ms):
            self.mate_sync.readmit(hb.incarnation)
            self._decide(now_ms, DecisionKind.SYNC,
                         f"{self.role.value}: {mate.value} caught up on the mate link → in sync, "
                         f"epoch {self.active_epoch}")
        else:
            self._check_mate_sync(now_ms)

    def acks_need_mate(self, now_ms: int) -> bool:
        """Must acknowledgements wait for the mate's ack? While it is in sync, and until the in-sync lease
        it may still hold has surely ended (DESIGN §4)."""
        return self.activity is Activity.ACTIVE and (self.mate_sync.synced or now_ms < self.mate_sync.grant_bound)

    def void_insync_lease(self, now_ms: int, why: str) -> None:
        """Standby side: give our in-sync lease up at once (a catch-up began: docs/mate_link.md rule 4)."""
        if self.insync.holds(now_ms):
            self.insync.clear()
            self._decide(now_ms, DecisionKind.SYNC,
                         f"{self.role.value}: {why} → out of sync until the active grants again")

    def released_position(self, now_ms: int, seq: int, durable_seq: int = 0) -> bool:
        """Active side: `seq` is the highest op whose effects were released (acknowledged to clients),
        `durable_seq` the highest op durable here. Heartbeats carry our position and an in-sync mate copies
        it; a mate out of sync keeps an older copy, so it can never count as most up to date (R4) holding
        less than we acknowledged. While acknowledgements need the mate we advertise what was released; once
        they do not (R9) we advertise what is durable here, on disk first, in a heartbeat at once (True: wake
        the sender), and release only what a peer echoed back (`release_bound`). Else on disk at most once a
        second, by `handle_timer`: the caller (the broker loop) never waits for that save."""
        if self.activity is not Activity.ACTIVE or self.state.spool_epoch != self.active_epoch:
            return False
        alone = not self.acks_need_mate(now_ms)
        target = max(seq, durable_seq) if alone else seq
        if target <= self.state.spool_seq:
            return False
        if alone and self._echoed_seq < self.state.spool_seq:
            return False  # one advertisement in flight at a time: its echo asks for the next (one save per round trip)
        before = self.state.spool_seq
        self.state.spool_seq = target
        if alone or not self.mate_sync.synced:
            # R8: a position not on disk is not advertised, so nothing is released on it
            if not self._save_position(now_ms) and alone:
                self.state.spool_seq = before
                return False
        else:
            self._position_unsaved = True
        if alone:
            self._send_heartbeat(now_ms)
        return alone

    def release_bound(self, now_ms: int) -> int:
        """R9: the highest op whose effects may be released without the mate's ack (-1: none may). While
        acknowledgements need the mate, none; after, only up to a position of ours a peer has echoed."""
        if not self.acks_need_mate(now_ms) and self.state.spool_epoch == self.active_epoch:
            return self._echoed_seq
        return -1

    def set_spool_position(self, epoch: int, seq: int) -> None:
        if (epoch, seq) != (self.state.spool_epoch, self.state.spool_seq):
            self.state.spool_epoch, self.state.spool_seq = epoch, seq

    def request_force(self, now_ms: int, *, acknowledge_data_loss: bool) -> None:
        """An operator's forced bid: skips the up-to-date proof, never the vote or the lease rules."""
        if self.role is Role.MONITOR:
            raise LocalProtocolError("the monitor never holds activity")
        if not acknowledge_data_loss:
            raise LocalProtocolError("forcing activity may lose acknowledged messages; "
                                     "repeat with the data-loss acknowledgement to proceed")
        if self.activity is Activity.ACTIVE:
            raise LocalProtocolError("this node already holds activity")
        active = self.active_role(now_ms)
        if active is not None:
            raise LocalProtocolError(f"the {active.value} holds activity and is healthy; a forced bid cannot "
                                     f"take it over (it still needs a vote)")
        self._force_until = now_ms + 10 * self.timing.quiet_ms
        if self.bid_epoch:
            self._bid_forced = True  # a bid already under way gets the voters' waiver too
        self._decide(now_ms, DecisionKind.FORCE, f"{self.role.value}: operator forced a bid, data loss acknowledged")
        self._evaluate(now_ms)

    # --- outputs --------------------------------------------------------------

    def datagrams_to_send(self) -> list[bytes]:
        """Datagrams for both peers (each goes to every peer's address)."""
        out, self._outbox = self._outbox, []
        return out

    def decisions(self) -> list[Decision]:
        out, self._decisions = self._decisions, []
        return out

    def get_timer(self) -> int:
        """The next instant `handle_timer` must run.

        The heartbeat deadline always moves forward when it fires; the others only
        count while still ahead of us, so a passed one cannot spin the caller.
        """
        others = self.handover.timers()
        if self.activity is Activity.ACTIVE:
            others.append(self.lease_expiry)
        else:
            # Moments when a bid or a vote may become allowed: act on them at once,
            # not at the next heartbeat tick (it shortens failover by up to a tick).
            others.append(self._hold_until)
            others += [p.claim_at + self.timing.quiet_ms + 1 for p in self.peers.values() if p.claim_at is not None]
        return min([self._next_heartbeat_at] + [d for d in others if d > self._now])

    def may_serve(self, now_ms: int) -> bool:
        return self.activity is Activity.ACTIVE and now_ms < self.lease_expiry and self.handover.draining is None

    def serving_bound(self) -> tuple[int, int]:
        """`may_serve` as one value for a reader that holds no lock: (serving while now < the first, the
        active epoch). The adapter publishes it whenever it releases the core (heartbeats.py)."""
        if self.activity is Activity.ACTIVE and self.handover.draining is None:
            return self.lease_expiry, self.active_epoch
        return 0, self.active_epoch

    def sees(self, role: Role, now_ms: int) -> bool:
        """Mutual visibility: a round trip completed within the lease."""
        peer = self.peers[role]
        return peer.echo_sent_at is not None and now_ms - peer.echo_sent_at < self.timing.lease_ms

    def in_sync(self, now_ms: int) -> bool:
        return self.insync.holds(now_ms)

    def redundancy_status(self, now_ms: int) -> RedundancyStatus:
        if self.role is Role.MONITOR:
            ok = all(self.sees(r, now_ms) for r in self.peers)
        elif self.activity is Activity.ACTIVE:
            ok = self.mate_sync.synced and self.sees(self.role.mate(), now_ms)
        else:
            ok = self.in_sync(now_ms)
        return RedundancyStatus.UP if ok else RedundancyStatus.DOWN

    def active_role(self, now_ms: int) -> Role | None:
        """Who we believe serves: ourselves, or a peer whose recent heartbeat claimed it."""
        if self.may_serve(now_ms):
            return self.role
        best = None
        for peer in self.peers.values():
            hb = peer.hb
            if hb and hb.activity is Activity.ACTIVE and now_ms - peer.heard_at < self.timing.lease_ms:
                if best is None or hb.epoch > best[0]:
                    best = (hb.epoch, peer.role)
        return best[1] if best else None

    # --- the rules ------------------------------------------------------------

    def _expire(self, now_ms: int) -> None:
        if self.activity is Activity.ACTIVE and now_ms >= self.lease_expiry:
            ago = now_ms - (self.lease_expiry - self.timing.lease_ms)
            self._step_down(now_ms, f"lease expired: no peer echoed a heartbeat sent in the last "
                                    f"{_secs(ago)} → stopping service")
        drain = self.handover.draining
        if drain is not None and now_ms >= drain.deadline:
            self.abort_handover(now_ms, f"the {self.role.mate().value} did not acknowledge every op within "
                                        f"{_secs(drain.deadline - drain.started_at)}")
        stalled = self.broker_stalled_ms(now_ms)
        if self.activity is Activity.ACTIVE and stalled:
            self._step_down(now_ms, f"broker event loop stalled {_secs(stalled)} → releasing activity")

    def _on_heartbeat(self, hb: Heartbeat, now_ms: int) -> bool:
        """Returns whether to answer at once: an active alone advertised a new position (R9)."""
        peer = self.peers[hb.sender]
        prior = peer.hb
        peer.hb, peer.heard_at = hb, now_ms
        answer = (hb.activity is Activity.ACTIVE and not hb.has(FLAG_REDUNDANCY_UP) and prior is not None
                  and prior.incarnation == hb.incarnation
                  and (hb.spool_epoch, hb.spool_seq) > (prior.spool_epoch, prior.spool_seq))
        if hb.epoch > self.state.epoch:
            if self.activity is Activity.ACTIVE:
                self._step_down(now_ms, f"{hb.sender.value} reports epoch {hb.epoch} > ours {self.active_epoch} "
                                        f"→ stepping down")
            self._adopt_epoch(hb.epoch, now_ms, f"learned epoch {hb.epoch} from {hb.sender.value}")
        if self.bid_epoch and hb.epoch >= self.bid_epoch and hb.vote_for is not self.role:
            self._end_bid(now_ms, f"epoch {hb.epoch} already taken (seen from {hb.sender.value})")

        mine = hb.view_of(self.role)
        echo_at = None
        if mine and mine.incarnation == self.state.incarnation:
            echo_at = self._sent.get(mine.seq)
            if echo_at is not None and (peer.echo_sent_at is None or echo_at > peer.echo_sent_at):
                peer.echo_sent_at = echo_at

        claims = hb.activity is Activity.ACTIVE or (
            hb.bid_epoch and self.state.voted_for is hb.sender and hb.bid_epoch == self.state.voted_epoch)
        if claims:
            peer.claim_at, peer.claimed = now_ms, True
        elif self._yield_from(hb):  # H5: X ended its activity itself; no lease of its can still serve
            peer.claim_at, peer.claimed = now_ms - self.timing.quiet_ms - 1, True

        if self.activity is Activity.ACTIVE:
            if hb.activity is Activity.ACTIVE and hb.epoch >= self.active_epoch:
                # Equal epochs cannot both be active (one vote per epoch); a peer bug. Refuse to share.
                self._step_down(now_ms, f"{hb.sender.value} also claims epoch {hb.epoch} → stepping down")
            elif echo_at is not None and mine.seq >= self._activation_seq and hb.epoch <= self.active_epoch:
                self.lease_expiry = max(self.lease_expiry, echo_at + self.timing.lease_ms)
                if mine.spool_epoch == self.active_epoch and mine.spool_seq > self._echoed_seq:
                    self._echoed_seq = mine.spool_seq  # R9: this peer holds our position for the survivor
                    if not self.acks_need_mate(now_ms):
                        self.position_echoes += 1
        elif self.bid_epoch and hb.vote_for is self.role and hb.vote_epoch == self.bid_epoch:
            if echo_at is not None:
                self._activate(hb, echo_at, now_ms)
        elif self.role.routes_messages and hb.sender is self.role.mate():
            self._track_insync(hb, echo_at, now_ms)
        return answer

    def _track_insync(self, hb: Heartbeat, echo_at: int | None, now_ms: int) -> None:
        news = self.insync.on_mate(hb, echo_at, now_ms, epoch=self.state.epoch, me=self.role,
                                   incarnation=self.state.incarnation)
        if news:
            self._decide(now_ms, DecisionKind.SYNC, f"{self.role.value}: {news}")
        # A heartbeat that held us in sync when the active sent it names only what we acknowledged, even if it
        # reached us after our lease ran out (we stalled): what we hold is what the active held.
        granted = self.activity is Activity.STANDBY and hb.activity is Activity.ACTIVE and \
            hb.has(FLAG_MATE_IN_SYNC) and hb.epoch == self.state.epoch
        if (granted or self.insync.holds(now_ms) and self.insync.epoch == hb.epoch) and \
                (self.state.spool_epoch, self.state.spool_seq) < (hb.spool_epoch, hb.spool_seq):
            self.set_spool_position(hb.spool_epoch, hb.spool_seq)
            self._save(now_ms)

    def _evaluate(self, now_ms: int) -> None:
        if self.activity is Activity.ACTIVE:
            self._check_mate_sync(now_ms)
            self._consider_auto_revert(now_ms)
            return
        self._consider_votes(now_ms)
        if self.role.routes_messages:
            self._consider_bid(now_ms)

    def _consider_bid(self, now_ms: int) -> None:
        mate = self.role.mate()
        why_not = self._bid_obstacle(now_ms)
        if why_not:
            if self.bid_epoch:
                self._end_bid(now_ms, why_not)
            return
        if self.bid_epoch:
            return
        bid_epoch = max(self.state.epoch, self.state.voted_epoch) + 1
        before = self.state.voted_epoch, self.state.voted_for
        self.state.voted_epoch, self.state.voted_for = bid_epoch, self.role
        if not self._save(now_ms):  # R8
            self.state.voted_epoch, self.state.voted_for = before
            return
        self.bid_epoch = bid_epoch
        # a forced bid says so even when we think we are up to date: a voter that cannot confirm it (a restarted
        # monitor that never heard our mate) would otherwise refuse the operator's bid for ever
        self._bid_forced = now_ms < self._force_until
        self._bid_story = self._silence_story(mate, now_ms)
        self._bid_eligibility = self._eligible_reason(now_ms)[1]
        self._decide(now_ms, DecisionKind.BID,
                     f"{self.role.value}: {self._bid_story}, {self._bid_eligibility} "
                     f"→ asking for epoch {self.bid_epoch}")
        self._send_heartbeat(now_ms)

    def _bid_obstacle(self, now_ms: int) -> str:
        mate = self.role.mate()
        if now_ms < self._hold_until:
            return "holding after boot"
        if now_ms < self.handover.no_bid_until:
            return f"handed activity over; leaving it to the {mate.value}"
        stalled = self.broker_stalled_ms(now_ms)
        if stalled:
            return f"broker event loop stalled {_secs(stalled)}"
        quiet = self._quiet_since(mate)
        if quiet is not None and now_ms <= quiet:
            return f"{mate.value} claimed activity within {_secs(self.timing.quiet_ms)}"
        if not any(self.sees(r, now_ms) for r in self.peers):
            return "sees no peer"
        if not self._eligible_reason(now_ms)[0] and now_ms >= self._force_until:
            return "cannot show it is up to date"
        return ""

    def _end_bid(self, now_ms: int, why: str) -> None:
        self._decide(now_ms, DecisionKind.BID_END,
                     f"{self.role.value}: withdrawing bid for epoch {self.bid_epoch}: {why}")
        self.bid_epoch = 0
        self._bid_forced = False

    def _eligible_reason(self, now_ms: int) -> tuple[bool, str]:
        if self.in_sync(now_ms):
            return True, "in sync"
        if self.handover.holds_yield(self.state.epoch):
            return True, f"yielded epoch {self.state.epoch} and nobody took it"
        mine = (self.state.spool_epoch, self.state.spool_seq, self.role is Role.PRIMARY)
        theirs = self._mate_position(now_ms)
        if theirs is None:
            return False, f"{self.role.mate().value}'s position unknown"
        if mine >= theirs:
            return True, f"most up to date (spool {mine[0]}/{mine[1]} vs {theirs[0]}/{theirs[1]})"
        mate = self.role.mate()
        if mine[:2] == theirs[:2] and self.peers[mate].claimed:
            # R4': a tie with the last active is no loss (see R4), whichever of the two is the primary
            return True, f"holds all the {mate.value} released (spool {mine[0]}/{mine[1]})"
        return False, f"{mate.value} is more up to date"

    def _mate_position(self, now_ms: int) -> tuple[int, int, bool] | None:
        """The mate's (spool epoch, seq, is-primary): the higher of its own latest heartbeat and the
        monitor's view of it (R9: the position it advertised last may have reached only the monitor)."""
        mate = self.role.mate()
        known = []
        hb = self.peers[mate].hb
        if hb is not None:
            known.append((hb.spool_epoch, hb.spool_seq, mate is Role.PRIMARY))
        mon = self.peers[Role.MONITOR].hb
        view = mon.view_of(mate) if mon else None
        if view is not None and view.heard_ago_ms != NEVER_MS:
            known.append((view.spool_epoch, view.spool_seq, mate is Role.PRIMARY))
        return max(known) if known else None

    def _consider_votes(self, now_ms: int) -> None:
        for peer in self.peers.values():
            hb = peer.hb
            if hb is None or not hb.bid_epoch or now_ms - peer.heard_at >= self.timing.lease_ms:
                continue
            if hb.bid_epoch <= self.state.voted_epoch:
                continue
            refusal = self._vote_obstacle(hb, now_ms)
            if refusal:
                key = f"{hb.sender.value}/{hb.bid_epoch}"
                if key != self._last_refusal:  # one refusal decision per bid, not one per heartbeat
                    self._last_refusal = key
                    self._decide(now_ms, DecisionKind.REFUSE,
                                 f"{self.role.value}: not voting for {hb.sender.value} "
                                 f"(epoch {hb.bid_epoch}): {refusal}")
                continue
            before = self.state.voted_epoch, self.state.voted_for, self.state.epoch
            self.state.voted_epoch, self.state.voted_for = hb.bid_epoch, hb.sender
            self.state.epoch = max(self.state.epoch, hb.bid_epoch)
            if not self._save(now_ms):  # a vote is durable before anyone can see it (R8: or it is not granted)
                self.state.voted_epoch, self.state.voted_for, self.state.epoch = before
                continue
            peer.claim_at, peer.claimed = now_ms, True
            self._last_refusal = ""
            self._decide(now_ms, DecisionKind.VOTE,
                         f"{self.role.value}: {self._silence_story(hb.sender.mate(), now_ms)} "
                         f"→ granting epoch {hb.bid_epoch} to {hb.sender.value}")
            self._send_heartbeat(now_ms)

    def _vote_obstacle(self, hb: Heartbeat, now_ms: int) -> str:
        if now_ms < self._hold_until:
            return "holding after boot"
        if self.activity is Activity.ACTIVE:
            return "we hold activity"
        if self.bid_epoch:
            return "we are bidding ourselves"
        for peer in self.peers.values():
            if peer.role is not hb.sender and peer.claim_at is not None and now_ms - peer.claim_at <= self.timing.quiet_ms:
                if not peer.claimed:
                    return "holding after boot"
                return f"{peer.role.value} claimed activity {_secs(now_ms - peer.claim_at)} ago"
        if hb.has(FLAG_BID_FORCED) or hb.has(FLAG_SELF_IN_SYNC):
            return ""
        theirs = (hb.spool_epoch, hb.spool_seq, hb.sender is Role.PRIMARY)
        if self.role.routes_messages:
            other = (self.state.spool_epoch, self.state.spool_seq, self.role is Role.PRIMARY)
        else:
            view = hb.sender.mate()
            other_hb = self.peers[view].hb
            if other_hb is None:
                return f"cannot confirm {hb.sender.value} is more up to date than {view.value} (never heard it)"
            other = (other_hb.spool_epoch, other_hb.spool_seq, view is Role.PRIMARY)
            if theirs[:2] == other[:2] and self.peers[view].claimed:
                return ""  # R4': the candidate ties with the last active, which it holds all of
        if theirs < other:
            return "candidate is not the most up to date"
        return ""

    def _activate(self, vote: Heartbeat, echo_at: int, now_ms: int) -> None:
        mate = self.role.mate()
        lease_expiry = echo_at + self.timing.lease_ms
        quiet = self._quiet_since(mate)
        if now_ms >= lease_expiry:
            self._end_bid(now_ms, "the vote arrived too late to give a lease")
            return
        if quiet is not None and now_ms <= quiet:
            self._end_bid(now_ms, f"{mate.value} claimed activity meanwhile")
            return
        epoch = self.bid_epoch
        eligible = "forced by operator" if self._bid_forced else self._bid_eligibility
        position_before = (self.state.spool_epoch, self.state.spool_seq)
        epoch_before = self.state.epoch
        self.state.epoch = max(self.state.epoch, epoch)
        if self.state.spool_epoch < epoch:  # a new epoch starts a new history on top of ours
            self.state.spool_epoch, self.state.spool_seq = epoch, 0
        if not self._save(now_ms):  # R2: the epoch is on disk before we serve (R8: or we do not serve)
            self.state.epoch = epoch_before
            self.state.spool_epoch, self.state.spool_seq = position_before
            self._end_bid(now_ms, "its epoch could not be saved")
            return
        self.active_epoch = epoch
        self.lease_expiry = lease_expiry
        self._echoed_seq = -1
        self._activation_seq = self._seq + 1
        self.mate_sync.activate(now_ms, self.peers[mate].hb, self.sees(mate, now_ms), position_before)
        self.bid_epoch = 0
        self.insync.clear()
        self._decide(now_ms, DecisionKind.ACTIVATE,
                     f"{self.role.value}: {self._bid_story}, {vote.sender.value} concurs, "
                     f"{eligible} → taking activity, epoch {epoch}")
        self._send_heartbeat(now_ms)

    def _step_down(self, now_ms: int, why: str) -> None:
        epoch = self.active_epoch
        self._check_mate_sync(now_ms)
        self.mate_sync.step_down()
        if self.handover.draining is not None:
            self.handover.draining = None
            self.handover.aborted += 1
        self.active_epoch = 0
        self.lease_expiry = 0
        self._decide(now_ms, DecisionKind.STEP_DOWN, f"{self.role.value}: {why}, epoch {epoch}")
        self._send_heartbeat(now_ms)

    def _adopt_epoch(self, epoch: int, now_ms: int, why: str) -> None:
        self.insync.newer_epoch(epoch, self.bid_epoch)
        self.mate_sync.closed_in_sync = False
        self.state.epoch = epoch
        self._save(now_ms)  # R8: adopted in memory even so (it only fences us)
        self._decide(now_ms, DecisionKind.EPOCH, f"{self.role.value}: {why}")

    def _silence_story(self, role: Role, now_ms: int) -> str:
        """Why `role` is not in the way: the words a decision opens with."""
        peer = self.peers.get(role)
        if peer is None or not peer.claimed:
            return "nobody active"
        if peer.hb is not None and self._yield_from(peer.hb) and now_ms - peer.heard_at < self.timing.lease_ms:
            return f"{role.value} handed activity over (yielded epoch {peer.hb.epoch})"
        if peer.hb is not None and peer.hb.activity is not Activity.ACTIVE and now_ms - peer.heard_at < self.timing.lease_ms:
            return f"{role.value} gave up activity {_secs(now_ms - peer.claim_at)} ago"
        return f"{role.value} unseen {_secs(now_ms - peer.claim_at)}"

    def _quiet_since(self, role: Role) -> int | None:
        """The instant after which `role`'s claims to us have been silent long enough."""
        claim_at = self.peers[role].claim_at
        return None if claim_at is None else claim_at + self.timing.quiet_ms

    def _check_mate_sync(self, now_ms: int) -> None:
        mate = self.role.mate()
        why = self.mate_sync.drop_reason(now_ms, self.peers[mate].hb, self.sees(mate, now_ms))
        if why:
            self._decide(now_ms, DecisionKind.SYNC,
                         f"{self.role.value}: {mate.value} {why} → redundancy down, "
                         f"{mate.value} out of sync for epoch {self.active_epoch}")

    # --- heartbeats -----------------------------------------------------------

    def _send_heartbeat(self, now_ms: int) -> None:
        self._seq += 1
        self._sent[self._seq] = now_ms
        while len(self._sent) > SENT_HISTORY:
            self._sent.popitem(last=False)
        flags = 0
        if self.activity is Activity.ACTIVE:
            self._check_mate_sync(now_ms)
            mate = self.peers[self.role.mate()]
            if self.mate_sync.granting(self.sees(mate.role, now_ms)):
                flags |= FLAG_MATE_IN_SYNC
                self.mate_sync.granted(mate.heard_at)
        elif self.mate_sync.closed_in_sync:
            flags |= FLAG_MATE_IN_SYNC
        if self.activity is Activity.STANDBY and self.in_sync(now_ms):
            flags |= FLAG_SELF_IN_SYNC
        if self.bid_epoch and self._bid_forced:
            flags |= FLAG_BID_FORCED
        if self.activity is Activity.STANDBY and self.handover.holds_yield(self.state.epoch, bool(self.bid_epoch)):
            flags |= FLAG_YIELDED | FLAG_MATE_IN_SYNC
        elif self.bid_epoch and self.handover.holds_yield(self.state.epoch):
            flags |= FLAG_SELF_IN_SYNC  # H6: we hold every op of the last epoch anyone served
        if self.redundancy_status(now_ms) is RedundancyStatus.UP:
            flags |= FLAG_REDUNDANCY_UP
        vote_open = self._vote_open()
        first, second = self.role.peers()
        hb = Heartbeat(
            group=self.auth.group, sender=self.role, incarnation=self.state.incarnation, seq=self._seq,
            epoch=self.state.epoch, activity=self.activity, views=(self._view(first, now_ms), self._view(second, now_ms)),
            flags=flags, bid_epoch=self.bid_epoch,
            vote_epoch=self.state.voted_epoch if vote_open else 0,
            vote_for=self.state.voted_for if vote_open else None,
            spool_epoch=self.state.spool_epoch, spool_seq=self.state.spool_seq, config_version=self.config_version,
        )
        self._outbox.append(self.auth.seal(hb))
        self._next_heartbeat_at = now_ms + self.timing.heartbeat_interval_ms

    def _vote_open(self) -> bool:
        """Repeat our latest vote (datagrams get lost) while its candidate is still bidding for it."""
        voted_for = self.state.voted_for
        if voted_for is None or voted_for is self.role or self.state.voted_epoch < self.state.epoch:
            return False
        hb = self.peers[voted_for].hb
        return hb is not None and hb.bid_epoch == self.state.voted_epoch

    def _view(self, role: Role, now_ms: int) -> PeerView:
        peer = self.peers[role]
        hb = peer.hb
        if hb is None:
            # an authentic but unconfirmed sender learns we know its boot, so it can confirm us (auth.py
            # rule 6); seq 0 echoes none of its heartbeats: what may be a recording extends no lease
            incarnation, _ = self.auth.unconfirmed.get(role, (0, 0))
            return PeerView(role, incarnation)
        claim_ago = NEVER_MS
        if hb.activity is Activity.ACTIVE and peer.claim_at is not None:
            claim_ago = min(now_ms - peer.claim_at, NEVER_MS - 1)
        return PeerView(role, hb.incarnation, hb.seq, min(now_ms - peer.heard_at, NEVER_MS - 1), claim_ago,
                        hb.epoch, hb.spool_epoch, hb.spool_seq)

    def _save_position(self, now_ms: int) -> bool:
        if not self._save(now_ms):
            return False
        self._position_saved_at = now_ms
        self._position_unsaved = False
        return True

    def _save(self, now_ms: int) -> bool:
        """R8: save the state; False (reported once per episode) if the store could not."""
        try:
            self.store.save(self.state)
        except OSError as exc:
            if self.save_error is None:
                self._decide(now_ms, DecisionKind.STORAGE,
                             f"{self.role.value}: cannot save the quorum state ({exc}) → "
                             "no bid, vote or new epoch until it can")
            self.save_error = str(exc)
            return False
        if self.save_error is not None:
            self.save_error = None
            self._decide(now_ms, DecisionKind.STORAGE, f"{self.role.value}: the quorum state is saved again")
        return True

    def _decide(self, now_ms: int, kind: DecisionKind, reason: str) -> None:
        """R5: the one place activity changes, by the table in decisions.py."""
        self.activity = next_activity(self.activity, kind)
        epoch = self.active_epoch or self.bid_epoch or self.state.epoch
        if kind is DecisionKind.STEP_DOWN or kind is DecisionKind.ACTIVATE:
            epoch = self.state.epoch
        decision = Decision(now_ms, self.role, kind, epoch, reason)
        self._decisions.append(decision)
        self.history.append(decision)


def _secs(ms: int) -> str:
    return f"{ms / 1000:.2f} s"
