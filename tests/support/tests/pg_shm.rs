//! A dropped PostgreSQL server leaves no shared memory behind. A postmaster killed outright
//! leaves its System V segment (and a `/dev/shm` file) until the machine reboots; past the
//! kernel's 4,096 segments, every later server fails to start with "could not create shared
//! memory segment: No space left on device", on a CI machine that runs the suite again and again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fencelock_testsupport::PgServer;

/// The System V segment ids the kernel lists.
fn segments() -> Vec<String> {
    std::fs::read_to_string("/proc/sysvipc/shm")
        .expect("read /proc/sysvipc/shm")
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .collect()
}

#[test]
fn a_dropped_server_removes_its_shared_memory() {
    let pg = PgServer::start();
    // postmaster.pid's 7th line: the segment's key and id.
    let pid_file = std::fs::read_to_string(pg.dir.join("data/postmaster.pid")).unwrap();
    let shmid = pid_file
        .lines()
        .nth(6)
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no segment in postmaster.pid:\n{pid_file}"))
        .to_owned();
    assert!(
        segments().contains(&shmid),
        "segment {shmid} is not listed while the server runs"
    );
    drop(pg);
    assert!(
        !segments().contains(&shmid),
        "segment {shmid} outlived its server"
    );
}
