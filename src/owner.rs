//! Who holds a lock: the identity every acquisition records with its queue entry.

use std::fmt;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The longest label [`Owner::with_label`] takes, in bytes.
pub const MAX_LABEL_LEN: usize = 256;

/// Marks an entry as ours; anything else (Go's Mutex, `etcdctl lock`, Curator) is foreign.
const MAGIC: &str = "fencelock/1";

/// The process behind a queue entry: host name, process id, process start time and an optional
/// label, recorded in the same request as the acquire (the etcd key's value, the ZooKeeper
/// node's data) and shown by [`LockBackend::status`](crate::LockBackend::status).
///
/// Host, pid and start time together name one process across restarts: a pid reused after a
/// restart has another start time.
///
/// ```
/// let me = fencelock::Owner::current().with_label("billing-worker-3")?;
/// assert_eq!(me.pid(), std::process::id());
/// assert_eq!(me.label(), Some("billing-worker-3"));
/// let read_back = fencelock::Owner::decode(me.encode().as_bytes());
/// assert_eq!(read_back, Some(me));
/// # Ok::<(), fencelock::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    host: String,
    pid: u32,
    started: u64,
    label: Option<String>,
}

impl Owner {
    /// This process, without a label.
    ///
    /// The host name is the kernel's (`/proc/sys/kernel/hostname`, else `$HOSTNAME`, else
    /// `unknown`); the start time is the kernel's record of when this process started, in unix
    /// seconds (from `/proc`; where there is none, the time of the first call in this process).
    pub fn current() -> Owner {
        static ME: OnceLock<(String, u64)> = OnceLock::new();
        let (host, started) = ME.get_or_init(|| (host_name(), process_start()));
        Owner {
            host: host.clone(),
            pid: std::process::id(),
            started: *started,
            label: None,
        }
    }

    /// The same owner with a free-form label (a role, a pod name, a job id), shown by `status`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a label longer than [`MAX_LABEL_LEN`] bytes or with control
    /// characters (a status line must stay one line).
    pub fn with_label(mut self, label: impl Into<String>) -> Result<Owner> {
        let label = label.into();
        if label.len() > MAX_LABEL_LEN {
            return Err(Error::config(
                "label",
                format!("is {} bytes; at most {MAX_LABEL_LEN}", label.len()),
            ));
        }
        if label.chars().any(char::is_control) {
            return Err(Error::config("label", "must not hold control characters"));
        }
        self.label = (!label.is_empty()).then_some(label);
        Ok(self)
    }

    /// The host name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// When the process started, in seconds since the unix epoch.
    pub fn started(&self) -> u64 {
        self.started
    }

    /// The label, if one was set.
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// The form stored with a queue entry: `fencelock/1 host=.. pid=.. started=.. [label=..]`,
    /// values percent-escaped, so it holds no space, `=` or control character of its own.
    pub fn encode(&self) -> String {
        let mut out = format!(
            "{MAGIC} host={} pid={} started={}",
            escape(&self.host),
            self.pid,
            self.started
        );
        if let Some(label) = &self.label {
            out.push_str(" label=");
            out.push_str(&escape(label));
        }
        out
    }

    /// Reads what [`encode`](Self::encode) wrote, found anywhere in `stored` (a backend may put
    /// its own words first). `None` for an entry written by another client.
    pub fn decode(stored: &[u8]) -> Option<Owner> {
        let text = std::str::from_utf8(stored).ok()?;
        let start = text.find(MAGIC)?;
        let mut words = text[start..].split(' ');
        if words.next() != Some(MAGIC) {
            return None;
        }
        let (mut host, mut pid, mut started, mut label) = (None, None, None, None);
        for word in words {
            let (key, value) = word.split_once('=')?;
            let value = unescape(value)?;
            match key {
                "host" => host = Some(value),
                "pid" => pid = value.parse().ok(),
                "started" => started = value.parse().ok(),
                "label" => label = Some(value),
                // A later version's field: skip it, keep what we know.
                _ => {}
            }
        }
        Some(Owner {
            host: host?,
            pid: pid?,
            started: started?,
            label,
        })
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({self})")
    }
}

/// `label pid 4242 on host, started 1767225600`; the label first when there is one.
impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(label) = &self.label {
            write!(f, "{label} ")?;
        }
        write!(
            f,
            "pid {} on {}, started {}",
            self.pid, self.host, self.started
        )
    }
}

fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_graphic() && !matches!(byte, b'%' | b'=') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn unescape(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Boot time (`/proc/stat` btime) plus the process's start in clock ticks since boot
/// (`/proc/self/stat` field 22), at the 100 ticks a second Linux reports to user space.
fn process_start() -> u64 {
    proc_start().unwrap_or_else(unix_now)
}

fn proc_start() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; the fields after its `)` do not.
    let after = stat.get(stat.rfind(')')? + 1..)?;
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let btime: u64 = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(btime + ticks / 100)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn what_is_encoded_decodes_to_the_same_owner_whatever_the_label_holds() {
        for label in ["plain", "two words", "a=b%c", "ünïcode ☃", ""] {
            let me = Owner::current().with_label(label).unwrap();
            let stored = format!("1767225600000-00ff00ff00ff00ff {}", me.encode());
            assert_eq!(
                Owner::decode(stored.as_bytes()),
                Some(me.clone()),
                "{label:?}"
            );
            assert!(!me.encode().contains('\n'));
        }
    }

    #[test]
    fn entries_of_other_clients_are_foreign() {
        for stored in [
            &b""[..],
            b"1767225600000",
            b"10.0.0.7",
            b"\xff\xfe",
            b"fencelock/1 pid=3",
        ] {
            assert_eq!(Owner::decode(stored), None, "{stored:?}");
        }
    }

    #[test]
    fn the_current_owner_is_this_process_started_in_the_past() {
        let me = Owner::current();
        assert_eq!(me.pid(), std::process::id());
        assert!(!me.host().is_empty());
        let now = unix_now();
        // Started no later than now, and (this test process) within the last day.
        assert!(
            me.started() <= now && now - me.started() < 86_400,
            "{me:?} at {now}"
        );
    }

    #[test]
    fn a_label_that_would_break_a_line_or_grow_a_value_is_refused() {
        assert!(Owner::current().with_label("a\nb").is_err());
        assert!(Owner::current()
            .with_label("x".repeat(MAX_LABEL_LEN + 1))
            .is_err());
        assert!(Owner::current()
            .with_label("x".repeat(MAX_LABEL_LEN))
            .is_ok());
    }
}
