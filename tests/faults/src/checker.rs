//! The history checker.

use std::collections::HashMap;
use std::time::Duration;

use crate::{Event, Kind};

/// What a history shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Acquisitions (critical sections entered).
    pub critical_sections: usize,
    /// Writes the register applied.
    pub accepted: usize,
    /// Writes the register refused as stale.
    pub refused: usize,
    /// Holders that noticed they had lost the lock.
    pub lost: usize,
    /// Accepted writes whose read was stale: an update of another holder was overwritten.
    pub lost_updates: usize,
    /// Accepted tokens that went down.
    pub token_order_violations: usize,
    /// Accepted writes from a holder after it had reported its loss.
    pub after_loss_violations: usize,
    /// Pairs of holders that both believed they held the lock and both had writes accepted
    /// while both believed it.
    pub overlap_violations: usize,
    /// Pairs of holders whose beliefs overlapped in time, writes or not: a successor granted
    /// before the last holder's `lost` fired. Expected when a holder is paused (it cannot hear
    /// its loss), and the case fencing covers; not counted as a violation.
    pub belief_overlaps: usize,
    /// The longest of those overlaps.
    pub longest_belief_overlap: Duration,
}

impl Report {
    /// All violations.
    pub fn violations(&self) -> usize {
        self.token_order_violations + self.after_loss_violations + self.overlap_violations
    }
}

/// A holder's belief that it held the lock: from its grant to its report of release or loss.
#[derive(Clone, Copy, Debug)]
struct Belief {
    pid: u32,
    token: u64,
    from: Duration,
    to: Duration,
    lost_at: Option<Duration>,
}

/// Checks a history: accepted tokens never go down; no write is accepted from a holder after it
/// reported its loss; no two holders believed they held the lock and both had writes accepted
/// while both believed it.
pub fn check(log: &[Event]) -> Report {
    let mut report = Report::default();
    let end = log.last().map_or(Duration::ZERO, |e| e.at);
    let mut beliefs: Vec<Belief> = Vec::new();
    let mut open: HashMap<(u32, u64), usize> = HashMap::new();
    for event in log {
        let key = (event.pid, event.token);
        match event.kind {
            Kind::Acquired | Kind::AcquiredRead => {
                report.critical_sections += 1;
                open.insert(key, beliefs.len());
                beliefs.push(Belief {
                    pid: event.pid,
                    token: event.token,
                    from: event.at,
                    to: end,
                    lost_at: None,
                });
            }
            Kind::Lost | Kind::Released => {
                if let Some(i) = open.remove(&key) {
                    beliefs[i].to = event.at;
                    if event.kind == Kind::Lost {
                        beliefs[i].lost_at = Some(event.at);
                        report.lost += 1;
                    }
                }
            }
            Kind::Read => {}
            Kind::Write {
                accepted: false, ..
            } => report.refused += 1,
            Kind::Write {
                accepted: true,
                stale_read,
            } => {
                report.accepted += 1;
                report.lost_updates += usize::from(stale_read);
            }
        }
    }
    let accepted: Vec<&Event> = log
        .iter()
        .filter(|e| matches!(e.kind, Kind::Write { accepted: true, .. }))
        .collect();
    report.token_order_violations = accepted
        .windows(2)
        .filter(|w| w[1].token < w[0].token)
        .count();
    for write in &accepted {
        let lost_before = beliefs.iter().any(|b| {
            b.pid == write.pid
                && b.token == write.token
                && b.lost_at.is_some_and(|at| at < write.at)
        });
        report.after_loss_violations += usize::from(lost_before);
    }
    for (i, a) in beliefs.iter().enumerate() {
        for b in &beliefs[i + 1..] {
            if a.pid == b.pid && a.token == b.token {
                continue;
            }
            let (from, to) = (a.from.max(b.from), a.to.min(b.to));
            if from >= to {
                continue;
            }
            report.belief_overlaps += 1;
            report.longest_belief_overlap = report.longest_belief_overlap.max(to - from);
            let wrote = |holder: &Belief| {
                accepted.iter().any(|w| {
                    w.pid == holder.pid && w.token == holder.token && w.at >= from && w.at <= to
                })
            };
            report.overlap_violations += usize::from(wrote(a) && wrote(b));
        }
    }
    report
}

/// How many held at once, by the holders' own beliefs (grant to release or loss).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    /// The most beliefs open at one moment.
    pub most: usize,
    /// The longest spell with more than `permits` beliefs open: a grant before an earlier
    /// holder heard its loss. Expected for a paused holder (it cannot hear it); for the
    /// others it must stay within about a round trip.
    pub longest_excess: Duration,
    /// All such spells together.
    pub total_excess: Duration,
}

/// Sweeps the beliefs of a history (a semaphore's, with `permits` permits).
pub fn holders(log: &[Event], permits: usize) -> Holders {
    let mut open: HashMap<(u32, u64), ()> = HashMap::new();
    let mut out = Holders::default();
    let mut excess_since: Option<Duration> = None;
    for event in log {
        let key = (event.pid, event.token);
        match event.kind {
            Kind::Acquired => drop(open.insert(key, ())),
            Kind::Lost | Kind::Released => drop(open.remove(&key)),
            _ => continue,
        }
        out.most = out.most.max(open.len());
        match (open.len() > permits, excess_since) {
            (true, None) => excess_since = Some(event.at),
            (false, Some(since)) => {
                out.longest_excess = out.longest_excess.max(event.at - since);
                out.total_excess += event.at - since;
                excess_since = None;
            }
            _ => {}
        }
    }
    if let (Some(since), Some(last)) = (excess_since, log.last()) {
        out.longest_excess = out.longest_excess.max(last.at - since);
        out.total_excess += last.at - since;
    }
    out
}

/// A reader-writer lock's history, by the holders' own beliefs (grant to release or loss).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwHolders {
    /// Write holds granted.
    pub writer_grants: usize,
    /// Read holds granted.
    pub reader_grants: usize,
    /// The most readers' beliefs open at one moment (2 or more: readers shared).
    pub most_readers: usize,
    /// Pairs of a writer and another holder (reader or writer) whose beliefs overlapped: a
    /// grant before the writer heard its loss, or a writer granted before a holder heard its
    /// own. Expected for a paused holder (it cannot hear it); otherwise a violation.
    pub writer_overlaps: usize,
    /// The longest of those overlaps.
    pub longest_writer_overlap: Duration,
    /// The time during which some writer's belief overlapped another's, all spells together.
    pub total_writer_overlap: Duration,
    /// Of the holders that heard their loss, the shortest time from that report to the next
    /// grant it conflicts with (a writer's, or anyone's after a writer): how close a `lost` came
    /// to being late.
    pub closest_grant_after_loss: Option<Duration>,
}

/// Checks a reader-writer lock's history: at no instant may a writer's belief overlap any other
/// holder's, on the register's clock (beliefs as [`check`] takes them, a reader's from
/// [`Kind::AcquiredRead`]).
pub fn rw_holders(log: &[Event]) -> RwHolders {
    let end = log.last().map_or(Duration::ZERO, |e| e.at);
    // (pid, token, writer, from, to, lost)
    let mut beliefs: Vec<(u32, u64, bool, Duration, Duration, bool)> = Vec::new();
    let mut open: HashMap<(u32, u64), usize> = HashMap::new();
    let mut out = RwHolders::default();
    for event in log {
        let key = (event.pid, event.token);
        let writer = match event.kind {
            Kind::Acquired => true,
            Kind::AcquiredRead => false,
            Kind::Lost | Kind::Released => {
                if let Some(i) = open.remove(&key) {
                    beliefs[i].4 = event.at;
                    beliefs[i].5 = event.kind == Kind::Lost;
                }
                continue;
            }
            _ => continue,
        };
        if writer {
            out.writer_grants += 1;
        } else {
            out.reader_grants += 1;
        }
        open.insert(key, beliefs.len());
        beliefs.push((event.pid, event.token, writer, event.at, end, false));
    }
    for (i, a) in beliefs.iter().enumerate() {
        for b in &beliefs[i + 1..] {
            let (from, to) = (a.3.max(b.3), a.4.min(b.4));
            if (a.2 || b.2) && (a.0, a.1) != (b.0, b.1) && from < to {
                out.writer_overlaps += 1;
                out.longest_writer_overlap = out.longest_writer_overlap.max(to - from);
            }
        }
    }
    for lost in beliefs.iter().filter(|b| b.5) {
        let next = beliefs
            .iter()
            .filter(|b| (lost.2 || b.2) && b.3 >= lost.4)
            .map(|b| b.3 - lost.4)
            .min();
        out.closest_grant_after_loss = match (out.closest_grant_after_loss, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    // A sweep over the beliefs' ends, in time order (the log's order can swap events that
    // arrived within microseconds): readers and writers open in each span between two ends.
    let mut ends: Vec<(Duration, i32, bool)> = beliefs
        .iter()
        .flat_map(|&(_, _, writer, from, to, _)| [(from, 1, writer), (to, -1, writer)])
        .collect();
    ends.sort_by_key(|&(at, step, _)| (at, step)); // at one instant, closes first
    let (mut readers, mut writers) = (0i32, 0i32);
    let mut since: Option<Duration> = None;
    for (at, step, writer) in ends {
        if let Some(from) = since.take() {
            out.total_writer_overlap += at - from;
        }
        if writer {
            writers += step;
        } else {
            readers += step;
        }
        out.most_readers = out.most_readers.max(usize::try_from(readers).unwrap_or(0));
        if writers >= 1 && readers + writers >= 2 {
            since = Some(at);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64, pid: u32, token: u64, kind: Kind) -> Event {
        Event {
            at: Duration::from_millis(ms),
            pid,
            token,
            kind,
        }
    }

    const OK: Kind = Kind::Write {
        accepted: true,
        stale_read: false,
    };
    const STALE_OK: Kind = Kind::Write {
        accepted: true,
        stale_read: true,
    };
    const REFUSED: Kind = Kind::Write {
        accepted: false,
        stale_read: true,
    };

    #[test]
    fn a_clean_handover_has_no_violation() {
        let log = [
            at(0, 1, 5, Kind::Acquired),
            at(1, 1, 5, OK),
            at(2, 1, 5, Kind::Released),
            at(3, 2, 6, Kind::Acquired),
            at(4, 2, 6, OK),
            at(5, 2, 6, Kind::Released),
        ];
        let report = check(&log);
        assert_eq!(
            (
                report.violations(),
                report.critical_sections,
                report.accepted
            ),
            (0, 2, 2)
        );
    }

    #[test]
    fn a_paused_holder_refused_is_safe_and_accepted_is_a_violation() {
        // A is paused mid-section; B takes over; A wakes and writes, then notices its loss.
        let fenced = [
            at(0, 1, 5, Kind::Acquired),
            at(1, 1, 5, OK),
            at(2, 1, 5, Kind::Read),
            at(10, 2, 6, Kind::Acquired),
            at(11, 2, 6, OK),
            at(20, 1, 5, REFUSED),
            at(21, 1, 5, Kind::Lost),
            at(22, 2, 6, Kind::Released),
        ];
        let report = check(&fenced);
        assert_eq!(
            (report.violations(), report.refused, report.lost),
            (0, 1, 1)
        );
        // A believed it held from 0 to its loss at 21 ms, B from 10 ms: they overlap 11 ms.
        assert_eq!(
            (report.belief_overlaps, report.longest_belief_overlap),
            (1, Duration::from_millis(11))
        );
        let mut unfenced = fenced;
        unfenced[5] = at(20, 1, 5, STALE_OK);
        let report = check(&unfenced);
        assert_eq!(
            (
                report.token_order_violations,
                report.overlap_violations,
                report.lost_updates
            ),
            (1, 1, 1)
        );
    }

    #[test]
    fn three_beliefs_of_two_permits_count_as_excess_while_they_last() {
        let log = [
            at(0, 1, 5, Kind::Acquired),
            at(1, 2, 6, Kind::Acquired),
            at(10, 3, 7, Kind::Acquired), // 1 is paused: its loss comes at 40 ms
            at(20, 2, 6, Kind::Released),
            at(30, 2, 8, Kind::Acquired),
            at(40, 1, 5, Kind::Lost),
        ];
        assert_eq!(
            holders(&log, 2),
            Holders {
                most: 3,
                longest_excess: Duration::from_millis(10),
                total_excess: Duration::from_millis(20),
            }
        );
        assert_eq!(holders(&log, 3).longest_excess, Duration::ZERO);
    }

    #[test]
    fn readers_share_and_a_writer_overlapping_anyone_is_counted() {
        let log = [
            at(0, 1, 5, Kind::AcquiredRead),
            at(1, 2, 5, Kind::AcquiredRead),
            at(10, 1, 5, Kind::Released),
            at(12, 2, 5, Kind::Released),
            at(12, 3, 6, Kind::Acquired), // granted as the last reader left: no overlap
            at(20, 3, 6, Kind::Released),
            at(21, 1, 7, Kind::Acquired),
            at(25, 2, 8, Kind::AcquiredRead), // 1 is paused: its loss comes at 40 ms
            at(30, 3, 9, Kind::Acquired),
            at(35, 2, 8, Kind::Lost),
            at(40, 1, 7, Kind::Lost),
        ];
        assert_eq!(
            rw_holders(&log),
            RwHolders {
                writer_grants: 3,
                reader_grants: 3,
                most_readers: 2,
                // 1-7 with 2-8 and with 3-9 (10 ms each); 2-8 with 3-9 (5 ms).
                writer_overlaps: 3,
                longest_writer_overlap: Duration::from_millis(10),
                // From 25 ms to 40 ms.
                total_writer_overlap: Duration::from_millis(15),
                // 2-8 lost at 35 ms, and no writer came after it; 1-7 at 40 ms, no one.
                closest_grant_after_loss: None,
            }
        );
        assert_eq!(rw_holders(&log[..6]).writer_overlaps, 0);
        // A writer that hears its loss 3 ms before a reader's grant.
        let in_time = [
            at(21, 1, 7, Kind::Acquired),
            at(22, 1, 7, Kind::Lost),
            at(25, 2, 8, Kind::AcquiredRead),
            at(31, 2, 8, Kind::Released),
            at(31, 3, 9, Kind::Acquired),
        ];
        let seen = rw_holders(&in_time);
        assert_eq!(
            (seen.writer_overlaps, seen.closest_grant_after_loss),
            (0, Some(Duration::from_millis(3)))
        );
    }

    #[test]
    fn a_write_after_the_reported_loss_is_a_violation() {
        let log = [
            at(0, 1, 5, Kind::Acquired),
            at(1, 1, 5, Kind::Lost),
            at(2, 1, 5, OK),
        ];
        assert_eq!(check(&log).after_loss_violations, 1);
    }
}
