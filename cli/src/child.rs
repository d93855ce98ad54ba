//! CMD's process: it dies with fencelock, so it can never run on without the lock.
//!
//! `run` starts `fencelock exec-child <its pid> -- CMD...`, which asks the kernel for SIGKILL
//! when its parent dies (`PR_SET_PDEATHSIG`, Linux; it survives `exec`), checks that the parent
//! is still there (it may have died before the request), and then becomes CMD by `execvp`.
//! Doing this in a process of our own, instead of between `fork` and `exec`, needs no `unsafe`.

use std::ffi::CString;

use nix::errno::Errno;

use crate::exit;

/// Arranges to die with `parent`, then replaces this process with `command`; returns an exit
/// code only if that failed.
pub fn exec(parent: u32, command: &[String]) -> u8 {
    if let Err(code) = die_with_parent(parent) {
        return code;
    }
    let Some(program) = command.first() else {
        eprintln!("fencelock: no command given after --");
        return exit::USAGE;
    };
    let args: Result<Vec<CString>, _> =
        command.iter().map(|a| CString::new(a.as_bytes())).collect();
    let Ok(args) = args else {
        eprintln!("fencelock: cannot run {program}: an argument contains a NUL byte");
        return exit::USAGE;
    };
    let Some(path) = args.first() else {
        return exit::USAGE;
    };
    // Returns only on failure.
    let Err(errno) = nix::unistd::execvp(path, &args);
    eprintln!("fencelock: cannot run {program}: {}", errno.desc());
    match errno {
        Errno::ENOENT | Errno::ENOTDIR => exit::CANNOT_RUN,
        _ => exit::NOT_EXECUTABLE,
    }
}

#[cfg(target_os = "linux")]
fn die_with_parent(parent: u32) -> Result<(), u8> {
    use nix::sys::signal::Signal;
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!(
            "fencelock: cannot tie CMD to fencelock's life: {}",
            e.desc()
        );
        return Err(exit::SOFTWARE);
    }
    // fencelock may have died between starting us and the request above.
    if u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(parent) {
        return Err(128 + Signal::SIGKILL as u8);
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_parent: u32) -> Result<(), u8> {
    // No parent-death signal here: CMD is stopped on loss and on fencelock's own signals, but
    // outlives a SIGKILL of fencelock (README, "The CLI").
    Ok(())
}
