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
            Kind::Acquired => {
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
    fn a_write_after_the_reported_loss_is_a_violation() {
        let log = [
            at(0, 1, 5, Kind::Acquired),
            at(1, 1, 5, Kind::Lost),
            at(2, 1, 5, OK),
        ];
        assert_eq!(check(&log).after_loss_violations, 1);
    }
}
