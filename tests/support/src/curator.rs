//! Curator's Java programs, compiled at test time against Debian's jars
//! (`libcurator-recipes-java`; `scripts/test` installs it and a JDK).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::{tmp_root, unique};

const JARS: [&str; 16] = [
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
    "netty-handler",
    "netty-transport",
    "netty-common",
    "netty-buffer",
    "netty-resolver",
    "netty-codec",
    "netty-transport-native-epoll",
    "netty-transport-native-unix-common",
];

/// The class path of Curator and its dependencies.
pub fn curator_classpath() -> String {
    JARS.iter()
        .map(|j| format!("/usr/share/java/{j}.jar"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Compiles `sources` into a fresh folder, which it returns.
///
/// # Panics
/// When `javac` cannot run or fails (its errors are in the message).
pub fn compile_java(sources: &[PathBuf]) -> PathBuf {
    let dir = tmp_root().join(unique("curator"));
    let out = std::process::Command::new("javac")
        .args(["-cp", &curator_classpath(), "-d"])
        .arg(&dir)
        .args(sources)
        .output()
        .expect("run javac (scripts/test installs a JDK and libcurator-recipes-java)");
    assert!(
        out.status.success(),
        "javac failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// A Java program on Curator that answers commands on stdin with lines on stdout.
pub struct JavaProgram {
    /// The process (killed when dropped).
    pub child: Child,
    /// Its stdout.
    pub lines: Lines<BufReader<ChildStdout>>,
}

impl JavaProgram {
    /// Runs class `args[0]` from `classes` with the rest of `args`.
    ///
    /// # Panics
    /// When `java` cannot start.
    pub fn start(classes: &Path, args: &[&str]) -> Self {
        let cp = format!("{}:{}", classes.display(), curator_classpath());
        let mut child = Command::new("java")
            .args(["-Xmx64m", "-cp", &cp])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start java");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        JavaProgram { child, lines }
    }

    /// The next line, which must start with `prefix`, within `bound`.
    ///
    /// # Panics
    /// When no such line comes in time.
    pub async fn expect(&mut self, prefix: &str, bound: Duration) -> String {
        let line = tokio::time::timeout(bound, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("java printed nothing within {bound:?}, expected {prefix}"))
            .expect("read java's stdout");
        let line = line.unwrap_or_else(|| panic!("java exited before {prefix}"));
        assert!(line.starts_with(prefix), "expected {prefix}, got {line}");
        line
    }

    /// Sends one command line.
    ///
    /// # Panics
    /// When the program's stdin is closed.
    pub async fn send(&mut self, command: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to java");
        stdin.flush().await.expect("flush to java");
    }
}
