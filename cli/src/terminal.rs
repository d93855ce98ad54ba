//! An interactive CMD gets the terminal.
//!
//! CMD runs in a process group of its own (so that a loss can stop all of it), which at a
//! terminal makes it a background job: a prompt would stop it with SIGTTIN while fencelock held
//! the lock forever. So when stdin is a terminal that fencelock has in the foreground, CMD's
//! group is given the foreground for as long as it runs (Ctrl-C and Ctrl-Z then reach CMD, as
//! without the wrapper), and fencelock takes it back afterwards.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use nix::sys::signal::{killpg, pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::unistd::{getpgrp, tcgetpgrp, tcsetpgrp, Pid};

/// The terminal's foreground, handed to CMD; given back when dropped.
pub struct Foreground {
    restore: Option<Pid>,
}

impl Foreground {
    /// Gives the terminal on stdin to process group `pgid`, if stdin is a terminal whose
    /// foreground is fencelock's group (not when fencelock itself runs as a background job).
    pub fn hand_to(pgid: Option<u32>) -> Self {
        let none = Foreground { restore: None };
        let stdin = std::io::stdin();
        let Some(pgid) = pgid.and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw) else {
            return none;
        };
        if !stdin.is_terminal() {
            return none;
        }
        let ours = getpgrp();
        if tcgetpgrp(stdin.as_fd()) != Ok(ours) || tcsetpgrp(stdin.as_fd(), pgid).is_err() {
            return none;
        }
        // CMD may have read the terminal before it was its own, and been stopped for it.
        let _ = killpg(pgid, Signal::SIGCONT);
        Foreground {
            restore: Some(ours),
        }
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        let Some(ours) = self.restore.take() else {
            return;
        };
        // From a background group, taking the terminal back raises SIGTTOU unless it is
        // blocked; block it on this thread for the call.
        let mut blocked = SigSet::empty();
        blocked.add(Signal::SIGTTOU);
        let mut previous = SigSet::empty();
        let masked = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), Some(&mut previous));
        let _ = tcsetpgrp(std::io::stdin().as_fd(), ours);
        if masked.is_ok() {
            let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&previous), None);
        }
    }
}
