//! Exit codes (sysexits where one fits) and error reports.

use fencelock::{Error, StoreFailure};

/// Bad arguments or URL.
pub const USAGE: u8 = 64;
/// The backend could not be reached or failed.
pub const UNAVAILABLE: u8 = 69;
/// Internal failure.
pub const SOFTWARE: u8 = 70;
/// The backend refused the credentials or their permissions (EX_NOPERM).
pub const NOPERM: u8 = 77;
/// The lock was not acquired: `--try` found it held, or `--timeout` passed.
pub const NOT_ACQUIRED: u8 = 75;
/// The lock was lost while CMD ran; CMD was sent SIGTERM, then SIGKILL after `--grace`.
pub const LOST: u8 = 76;
/// CMD could not be started.
pub const CANNOT_RUN: u8 = 127;

/// A file exists but cannot be run (permissions, not an executable).
pub const NOT_EXECUTABLE: u8 = 126;

/// The exit codes of `run`, and CMD's environment (`fencelock run --help`).
pub const RUN_HELP: &str = "\
Exit codes: CMD's own status when it finishes (128+N if a signal N ended it); 64 bad
  arguments, URL or no backend named; 69 backend unreachable or failing; 75 lock not acquired
  (--try, --timeout); 76 lock LOST while CMD ran (CMD got SIGTERM, then SIGKILL after
  --grace); 77 credentials refused or not permitted; 126 CMD not executable; 127 CMD not found;
  128+N fencelock itself got signal N before CMD started.
CMD's environment: FENCELOCK_TOKEN (pass it to every resource CMD writes), FENCELOCK_NAME,
  FENCELOCK_BACKEND (password hidden). On Linux CMD is killed if fencelock dies (even by
  SIGKILL), so it never runs on without the lock.";

/// The exit codes of `status`, `list` and the top level.
pub const HELP: &str = "\
Exit codes: 0 done; 64 bad arguments, URL or no backend named; 69 backend unreachable or
  failing; 77 credentials refused or not permitted. `fencelock run --help` lists run's.
The backend comes from --backend or FENCELOCK_BACKEND; its password is never printed.";

/// Prints `e` for a person and returns the matching exit code.
pub fn report(e: &Error) -> u8 {
    eprintln!("fencelock: {e}");
    match e {
        Error::InvalidName { .. } | Error::InvalidConfig { .. } | Error::PermitsMismatch { .. } => {
            USAGE
        }
        Error::WouldBlock { .. } | Error::Timeout { .. } => NOT_ACQUIRED,
        Error::LockLost { .. } | Error::NotHeld { .. } | Error::StaleToken { .. } => LOST,
        Error::Backend {
            kind: StoreFailure::Unauthorized,
            ..
        } => NOPERM,
        _ => UNAVAILABLE,
    }
}
