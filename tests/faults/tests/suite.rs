//! The fault-injection suite. A short run here (in CI); a longer one with
//! `FENCELOCK_FAULT_ROUNDS=20 cargo test -p fencelock-faults --release -- --nocapture`,
//! replayable with `FENCELOCK_FAULT_SEED=<seed printed by a run>`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use fencelock_faults::{
    holders, rw_holders, Backend, Fault, Harness, Primitive, Report, RwHolders, Schedule, PERMITS,
};
use tokio::sync::Mutex;

/// One backend at a time: the machine has two cores, and the suite measures behaviour under
/// faults, not under starvation.
const CONTENDER: &str = env!("CARGO_BIN_EXE_contender");

static SERIAL: Mutex<()> = Mutex::const_new(());

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn row(label: &str, report: &Report, faults: &BTreeMap<Fault, usize>) -> String {
    let faults: Vec<String> = faults.iter().map(|(f, n)| format!("{f:?} {n}")).collect();
    format!(
        "| {label} | {} | {} | {} | {} | {} | {} | {} |",
        faults.join(", "),
        report.critical_sections,
        report.accepted,
        report.refused,
        report.lost,
        report.lost_updates,
        report.violations()
    )
}

/// One harness run: servers, a register and 3 contenders for `primitive`, the `schedules` in
/// order with work before and after.
async fn history(
    (backend, primitive): (Backend, Primitive),
    fenced: bool,
    schedules: &[Schedule],
) -> (Report, Vec<fencelock_faults::Event>, BTreeMap<Fault, usize>) {
    let mut harness = Harness::start(CONTENDER, (backend, primitive), fenced, 3).await;
    harness.settle(Duration::from_secs(2)).await;
    for schedule in schedules {
        harness.run(schedule).await;
    }
    harness.settle(Duration::from_secs(2)).await;
    harness.finish().await
}

/// Scenarios 1-3: pause, partition, leader kill (and, on ZooKeeper, lost replies and a
/// follower cut off from the others), and a stalled leader, once each, in a fixed order.
fn each_fault_once() -> Schedule {
    Schedule::fixed(&[
        Fault::Pause,
        Fault::Partition,
        Fault::Kill,
        Fault::LostReplies,
        Fault::FollowerPartition,
        Fault::StallLeader,
    ])
}

/// The control run's faults: the same pause, twice.
fn pauses() -> Schedule {
    Schedule::fixed(&[Fault::Pause, Fault::Pause])
}

async fn suite(backend: Backend) {
    let _serial = SERIAL.lock().await;
    let rounds = env_number("FENCELOCK_FAULT_ROUNDS", 1);
    let seed = env_number(
        "FENCELOCK_FAULT_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs()),
    );
    let random = Schedule::random(seed, usize::try_from(rounds * 3).unwrap());
    eprintln!(
        "{backend:?}: seed {seed} (replay with FENCELOCK_FAULT_SEED={seed}); random faults {:?}",
        random.faults
    );

    // Scenarios 1-3, then 4: the seeded mix; 5: the control run, without fencing.
    let lock = (backend, Primitive::Lock);
    let (report, log, faults) = history(lock, true, &[each_fault_once(), random]).await;
    let (control_report, _, control_faults) = history(lock, false, &[pauses()]).await;

    eprintln!(
        "\n| {backend:?} run | faults | critical sections | writes accepted | stale writes refused | holders lost | lost updates | violations |\n|---|---|---|---|---|---|---|---|\n{}\n{}\n",
        row(&format!("fenced, {} rounds", rounds), &report, &faults),
        row("control, no fencing", &control_report, &control_faults)
    );
    assert_eq!(
        report.violations(),
        0,
        "{backend:?}: violations with fencing: {report:?}\nlog: {log:?}"
    );
    assert_eq!(
        report.lost_updates, 0,
        "{backend:?}: fencing must prevent lost updates: {report:?}"
    );
    assert!(
        report.refused > 0,
        "{backend:?}: the pause must have produced a refused stale write: {report:?}"
    );
    assert!(
        report.critical_sections > 10,
        "{backend:?}: work must go on between faults: {report:?}"
    );
    assert!(
        control_report.violations() > 0 && control_report.lost_updates > 0,
        "{backend:?}: without fencing the same pause must show the lost update, or the suite cannot fail: {control_report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_under_faults() {
    suite(Backend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_under_faults() {
    suite(Backend::ZooKeeper).await;
}

/// Elections under the same faults, fenced: never two leaders with writes accepted, no lost
/// update; and the control run, the same pause without fencing, which must show both.
async fn elections(backend: Backend) {
    let _serial = SERIAL.lock().await;
    let election = (backend, Primitive::Election);
    let (report, log, faults) = history(election, true, &[each_fault_once()]).await;
    let (control_report, _, control_faults) = history(election, false, &[pauses()]).await;
    eprintln!(
        "\n| {backend:?} elections | faults | leaderships | writes accepted | stale writes refused | leaders lost | lost updates | violations |\n|---|---|---|---|---|---|---|---|\n{}\n{}\n",
        row("fenced", &report, &faults),
        row("control, no fencing", &control_report, &control_faults)
    );
    assert!(
        control_report.violations() > 0 && control_report.lost_updates > 0,
        "{backend:?}: without fencing a paused leader must show the lost update: {control_report:?}"
    );
    assert_eq!(
        report.violations(),
        0,
        "{backend:?}: two leaders with writes accepted: {report:?}\nlog: {log:?}"
    );
    assert_eq!(report.lost_updates, 0, "{backend:?}: {report:?}");
    assert!(
        report.critical_sections > 10,
        "{backend:?}: leaders must keep working between faults: {report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_elections_under_faults() {
    elections(Backend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_elections_under_faults() {
    elections(Backend::ZooKeeper).await;
}

/// Issue 13.8: the leader stalled (SIGSTOP, then SIGCONT two TTLs later) three times while the
/// contenders renew through the other members; no holder is paused, so each must hear its
/// `lost` before a successor is granted (no overlap of beliefs, beyond a round trip where the
/// store itself removes the key), and no stale write may be accepted.
async fn stalled_leader(backend: Backend) {
    let _serial = SERIAL.lock().await;
    let stalls = Schedule::fixed(&[Fault::StallLeader; 3]);
    let (report, log, faults) = history((backend, Primitive::Lock), true, &[stalls]).await;
    eprintln!(
        "\n| {backend:?} run | faults | critical sections | writes accepted | stale writes refused | holders lost | lost updates | violations |\n|---|---|---|---|---|---|---|---|\n{}\nbelief overlaps: {} (longest {:?})\n",
        row("stalled leader", &report, &faults),
        report.belief_overlaps,
        report.longest_belief_overlap
    );
    assert_eq!(faults.get(&Fault::StallLeader), Some(&3), "{faults:?}");
    assert_eq!(
        report.violations(),
        0,
        "{backend:?}: {report:?}\nlog: {log:?}"
    );
    assert_eq!(report.lost_updates, 0, "{backend:?}: {report:?}");
    assert!(
        report.longest_belief_overlap < Duration::from_millis(500),
        "{backend:?}: a successor was granted long before the holder heard its loss: {report:?}\nlog: {log:?}"
    );
    // ZooKeeper writes stop while its leader is stalled and until the next election: few sections.
    assert!(report.critical_sections > 3, "{backend:?}: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_a_stalled_leader() {
    stalled_leader(Backend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_with_a_stalled_leader() {
    stalled_leader(Backend::ZooKeeper).await;
}

/// Partition, leader kill, ZooKeeper's lost replies and follower partition, a stalled leader:
/// the faults a holder can hear of (the semaphore and RW lock runs).
fn faults_that_do_not_pause_a_holder() -> Schedule {
    Schedule::fixed(&[
        Fault::Partition,
        Fault::Kill,
        Fault::LostReplies,
        Fault::FollowerPartition,
        Fault::StallLeader,
    ])
}

/// A semaphore of two permits under the faults that do not pause a holder (partition, leader
/// kill, ZooKeeper's lost replies and follower partition, a stalled leader): never more than two
/// holders at once by their own beliefs, beyond about a round trip where the store removes an
/// entry before its holder hears; both permits in use at times; the work goes on. The control
/// run pauses a holder, which cannot hear its loss: there a third holder must show, or the check
/// could not fail. (Writes go to one register, which N holders share by design: the fenced
/// register of the lock runs does not apply, so these runs are not fenced.)
async fn semaphore(backend: Backend) {
    let _serial = SERIAL.lock().await;
    let faults = faults_that_do_not_pause_a_holder();
    let pool = (backend, Primitive::Semaphore);
    let (report, log, applied) = history(pool, false, &[faults]).await;
    let seen = holders(&log, PERMITS as usize);
    let (control_report, control_log, control_applied) = history(pool, false, &[pauses()]).await;
    let control = holders(&control_log, PERMITS as usize);
    eprintln!(
        "\n| {backend:?} semaphore ({PERMITS} permits) | faults | permits granted | holders lost | most holders at once | time above {PERMITS} (longest spell) |\n|---|---|---|---|---|---|\n| faults | {applied:?} | {} | {} | {} | {:?} ({:?}) |\n| control, a paused holder | {control_applied:?} | {} | {} | {} | {:?} ({:?}) |\n",
        report.critical_sections, report.lost, seen.most, seen.total_excess, seen.longest_excess,
        control_report.critical_sections, control_report.lost, control.most, control.total_excess, control.longest_excess,
    );
    assert!(
        seen.total_excess < Duration::from_millis(500),
        "{backend:?}: a permit was granted long before its last holder heard its loss: {seen:?}\nlog: {log:?}"
    );
    assert_eq!(
        seen.most.min(PERMITS as usize),
        PERMITS as usize,
        "{backend:?}: both permits must be in use at times: {seen:?}"
    );
    assert!(report.critical_sections > 10, "{backend:?}: {report:?}");
    assert!(
        control.total_excess > Duration::from_millis(500),
        "{backend:?}: a paused holder believes past its loss, so the check must see a third holder: {control:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_semaphore_under_faults() {
    semaphore(Backend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_semaphore_under_faults() {
    semaphore(Backend::ZooKeeper).await;
}

fn rw_row(
    label: &str,
    report: &Report,
    seen: &RwHolders,
    faults: &BTreeMap<Fault, usize>,
) -> String {
    let faults: Vec<String> = faults.iter().map(|(f, n)| format!("{f:?} {n}")).collect();
    format!(
        "| {label} | {} | {} | {} | {} | {} | {} | {:?} ({:?}) | {} |",
        faults.join(", "),
        seen.writer_grants,
        seen.reader_grants,
        report.lost,
        seen.most_readers,
        seen.writer_overlaps,
        seen.total_writer_overlap,
        seen.longest_writer_overlap,
        seen.closest_grant_after_loss
            .map_or_else(|| "-".to_owned(), |d| format!("{d:?}")),
    )
}

/// A reader-writer lock under the semaphore's faults (partition, leader kill, ZooKeeper's lost
/// replies and follower partition, a stalled leader), each contender reading and writing in
/// turn: at no instant does a writer's belief overlap another holder's, reader or writer, with
/// no allowance (these contenders report a loss as `lost` fires and a release before it is
/// sent, so a belief ends in the log before the store can grant the lock again); readers
/// share at times; the work goes on. The control run pauses a holder, which cannot hear its
/// loss: there a writer must overlap it (or it a writer), or the check could not fail. (Not
/// fenced, as the semaphore: readers must not admit their tokens at the register.)
async fn rwlock(backend: Backend) {
    let _serial = SERIAL.lock().await;
    let faults = faults_that_do_not_pause_a_holder();
    let rw = (backend, Primitive::RwLock);
    let (report, log, applied) = history(rw, false, &[faults]).await;
    let seen = rw_holders(&log);
    let (control_report, control_log, control_applied) = history(rw, false, &[pauses()]).await;
    let control = rw_holders(&control_log);
    eprintln!(
        "\n| {backend:?} RW lock | faults | writer grants | reader grants | holders lost | most readers at once | writer overlaps | time a writer overlapped (longest) | closest conflicting grant after a loss |\n|---|---|---|---|---|---|---|---|---|\n{}\n{}\n",
        rw_row("faults", &report, &seen, &applied),
        rw_row("control, a paused holder", &control_report, &control, &control_applied),
    );
    assert_eq!(
        seen.writer_overlaps, 0,
        "{backend:?}: a writer's belief overlapped another holder's: {seen:?}\nlog: {log:?}"
    );
    assert!(
        seen.most_readers >= 2,
        "{backend:?}: readers must share at times: {seen:?}"
    );
    assert!(
        seen.writer_grants > 5 && seen.reader_grants > 5,
        "{backend:?}: the work must go on: {seen:?}"
    );
    assert!(
        control.writer_overlaps > 0 && control.total_writer_overlap > Duration::from_millis(500),
        "{backend:?}: a paused holder believes past its loss, so the check must see a writer overlap: {control:?}\nlog: {control_log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_rwlock_under_faults() {
    rwlock(Backend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_rwlock_under_faults() {
    rwlock(Backend::ZooKeeper).await;
}
