//! The `fencelock` command end to end against real etcd and ZooKeeper.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use fencelock_testsupport::{tmp_root, unique, EtcdCluster, ProxyMode, TcpProxy, ZkEnsemble};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");
const BOUND: Duration = Duration::from_secs(60);

fn etcd() -> &'static EtcdCluster {
    static SERVER: OnceLock<EtcdCluster> = OnceLock::new();
    SERVER.get_or_init(|| EtcdCluster::from_env_or_start(1))
}

fn zk() -> &'static ZkEnsemble {
    static SERVER: OnceLock<ZkEnsemble> = OnceLock::new();
    SERVER.get_or_init(|| ZkEnsemble::from_env_or_start(1))
}

fn etcd_url() -> String {
    format!(
        "etcd://{}/{}?ttl=2s",
        etcd().endpoints()[0].trim_start_matches("http://"),
        unique("cli")
    )
}

fn zk_url() -> String {
    format!(
        "zk://{}/{}?session_timeout=3s&tick_time=500ms",
        zk().connect_string(),
        unique("cli")
    )
}

fn fencelock(url: &str, args: &[&str]) -> Command {
    let mut cmd = bare(args);
    cmd.env("FENCELOCK_BACKEND", url);
    cmd
}

async fn output(url: &str, args: &[&str]) -> Output {
    tokio::time::timeout(BOUND, fencelock(url, args).output())
        .await
        .expect("fencelock finishes")
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn wait_for_file(path: &Path) -> String {
    tokio::time::timeout(BOUND, async {
        loop {
            if let Ok(s) = std::fs::read_to_string(path) {
                if s.ends_with('\n') {
                    return s;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the command starts")
}

/// Running or sleeping; a zombie (killed, waiting for a parent to reap it) counts as gone.
fn alive(pid: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) else {
        return false;
    };
    // The state follows the parenthesised command name.
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X"))
}

async fn exit_code(child: Child) -> i32 {
    let out = tokio::time::timeout(BOUND, child.wait_with_output())
        .await
        .expect("fencelock exits")
        .unwrap();
    eprintln!("fencelock stderr:\n{}", text(&out.stderr));
    out.status.code().expect("an exit code")
}

/// `fencelock status NAME --json`'s `waiting`, read every 100 ms until it is `n` (for at most
/// 30 s): the last one read.
async fn until_waiting(url: &str, name: &str, n: u64) -> serde_json::Value {
    let mut waiting = serde_json::Value::Null;
    for _ in 0..300 {
        let out = output(url, &["status", name, "--json"]).await;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        waiting = status["waiting"].clone();
        if waiting == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    waiting
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_vars_and_the_exit_status_pass_through() {
    for url in [etcd_url(), zk_url()] {
        let out = output(
            &url,
            &[
                "run",
                "job",
                "--",
                "sh",
                "-c",
                "echo $FENCELOCK_TOKEN $FENCELOCK_NAME $FENCELOCK_BACKEND; exit 3",
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        let words: Vec<&str> = stdout.split_whitespace().collect();
        assert!(words[0].parse::<u64>().is_ok_and(|t| t > 0), "{stdout}");
        assert_eq!(words[1], "job");
        assert_eq!(words[2], url);
        let status = output(&url, &["status", "job", "--json"]).await;
        assert!(
            text(&status.stdout).contains("\"held\":false"),
            "no lock left held: {}",
            text(&status.stdout)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_and_timeout_exit_75_while_another_holds() {
    for url in [etcd_url(), zk_url()] {
        let dir = tmp_root().join(unique("hold"));
        std::fs::create_dir_all(&dir).unwrap();
        let started = dir.join("started");
        let script = format!("echo $$ > {}; sleep 30", started.display());
        let holder = fencelock(&url, &["run", "job", "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        wait_for_file(&started).await;
        let tried = output(&url, &["run", "job", "--try", "--", "true"]).await;
        assert_eq!(tried.status.code(), Some(75), "{}", text(&tried.stderr));
        let timed = output(&url, &["run", "job", "--timeout", "300ms", "--", "true"]).await;
        assert_eq!(timed.status.code(), Some(75), "{}", text(&timed.stderr));
        let status = text(&output(&url, &["status", "job"]).await.stdout);
        assert!(status.starts_with("job: held by token"), "{status}");
        drop(holder); // kill_on_drop: SIGKILL to fencelock; the lease ends the lock
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_list_name_the_holder_and_the_waiter_of_other_processes_with_their_labels() {
    for url in [etcd_url(), zk_url()] {
        let dir = tmp_root().join(unique("who"));
        std::fs::create_dir_all(&dir).unwrap();
        let started = dir.join("started");
        let script = format!("echo $$ > {}; sleep 30", started.display());
        let holder = fencelock(&url, &["run", "--label", "billing worker", "job", "--"])
            .args(["sh", "-c", &script])
            .spawn()
            .unwrap();
        wait_for_file(&started).await;
        let waiter = fencelock(&url, &["run", "--label", "w2", "job", "--", "true"])
            .spawn()
            .unwrap();
        let mut seen = serde_json::Value::Null;
        for _ in 0..100 {
            let out = output(&url, &["status", "job", "--json"]).await;
            seen = serde_json::from_slice(&out.stdout).unwrap();
            if seen["waiting"] == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(seen["waiting"], 1, "{seen}");
        let me = fencelock::Owner::current();
        assert_eq!(seen["owner"]["label"], "billing worker", "{seen}");
        assert_eq!(seen["owner"]["pid"], holder.id().unwrap(), "{seen}");
        assert_eq!(seen["owner"]["host"], me.host(), "{seen}");
        assert_eq!(seen["foreign"], false, "{seen}");
        assert_eq!(seen["queue"][0]["token"], seen["token"], "{seen}");
        assert_eq!(seen["queue"][1]["owner"]["label"], "w2", "{seen}");
        assert_eq!(
            seen["queue"][1]["owner"]["pid"],
            waiter.id().unwrap(),
            "{seen}"
        );
        let line = text(&output(&url, &["status", "job"]).await.stdout);
        let pid = holder.id().unwrap();
        assert!(
            line.contains(&format!("(billing worker pid {pid} on ")),
            "{line}"
        );
        assert!(line.contains("\n  waiting: token "), "{line}");
        // `list` shows every lock under the prefix as `status` does.
        let listed = text(&output(&url, &["list"]).await.stdout);
        assert!(listed.starts_with("job: held by token "), "{listed}");
        assert!(
            listed.contains(&format!("(billing worker pid {pid} on ")),
            "{listed}"
        );
        assert!(listed.contains("\n  waiting: token "), "{listed}");
        let out = output(&url, &["list", "--json"]).await;
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
        assert_eq!(listed[0]["name"], "job", "{listed}");
        assert_eq!(listed[0]["owner"]["label"], "billing worker", "{listed}");
        assert_eq!(listed[0]["queue"][1]["owner"]["label"], "w2", "{listed}");
        let none = output(&url, &["list", "other", "--json"]).await;
        assert_eq!(text(&none.stdout).trim(), "[]");
        drop((holder, waiter));
    }
}

/// Revokes the lease behind the etcd key of lock `job` under the URL's prefix.
async fn revoke_holder(url: &str) {
    let prefix = url.split('/').nth(3).unwrap().split('?').next().unwrap();
    let keys = etcd()
        .etcdctl(&["get", "--prefix", "--keys-only", &format!("{prefix}/job/")])
        .unwrap();
    let key = keys.lines().find(|l| !l.trim().is_empty()).unwrap();
    // The key ends in the holder's lease id in hex, which is how `etcdctl lease revoke` takes it.
    let lease = key.rsplit('/').next().unwrap().trim();
    etcd().etcdctl(&["lease", "revoke", lease]).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_command_with_sigterm_then_sigkill() {
    for ignores_term in [false, true] {
        let url = etcd_url();
        let dir = tmp_root().join(unique("lost"));
        std::fs::create_dir_all(&dir).unwrap();
        let pids = dir.join("pids");
        // The command and a grandchild; one variant ignores SIGTERM.
        let trap = if ignores_term { "trap '' TERM;" } else { "" };
        let script = format!("{trap} sleep 60 & echo $$ $! > {}; wait", pids.display());
        let child = fencelock(
            &url,
            &["run", "job", "--grace", "1s", "--", "sh", "-c", &script],
        )
        .spawn()
        .unwrap();
        let pids = wait_for_file(&pids).await;
        revoke_holder(&url).await;
        assert_eq!(
            exit_code(child).await,
            76,
            "lost lock must exit 76 (ignores TERM: {ignores_term})"
        );
        for pid in pids.split_whitespace() {
            assert!(
                !alive(pid),
                "process {pid} outlived the lost lock (ignores TERM: {ignores_term})"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_zookeeper_client_stops_the_command() {
    let proxy = TcpProxy::start(zk().connect_string()).await;
    let url = format!(
        "zk://127.0.0.1:{}/{}?session_timeout=3s&tick_time=500ms",
        proxy.port,
        unique("cut")
    );
    let dir = tmp_root().join(unique("zkcut"));
    std::fs::create_dir_all(&dir).unwrap();
    let pid = dir.join("pid");
    let script = format!("echo $$ > {}; sleep 60", pid.display());
    let child = fencelock(
        &url,
        &["run", "job", "--grace", "1s", "--", "sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    let pid = wait_for_file(&pid).await;
    proxy.set_mode(ProxyMode::BlackHole);
    assert_eq!(exit_code(child).await, 76);
    assert!(!alive(&pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_are_forwarded_and_the_lock_released_after() {
    for (url, signal) in [
        (etcd_url(), "TERM"),
        (zk_url(), "TERM"),
        (etcd_url(), "HUP"),
        (etcd_url(), "QUIT"),
    ] {
        let dir = tmp_root().join(unique("sig"));
        std::fs::create_dir_all(&dir).unwrap();
        let started = dir.join("started");
        let script = format!(
            "trap 'exit 7' {signal}; echo go > {}; sleep 60 & wait",
            started.display()
        );
        let child = fencelock(&url, &["run", "job", "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        wait_for_file(&started).await;
        let pid = child.id().unwrap().to_string();
        std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert_eq!(
            exit_code(child).await,
            7,
            "fencelock must exit with the command's status"
        );
        let status = text(&output(&url, &["status", "job"]).await.stdout);
        assert_eq!(status.trim(), "job: free");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_exit_codes() {
    let cases: [(&str, &[&str], i32); 5] = [
        ("mem://", &["run", "a/b", "--", "true"], 64),
        ("redis://h", &["run", "job", "--", "true"], 64),
        ("mem://", &["run", "job", "--", "/no/such/command"], 127),
        ("mem://", &["run", "job"], 64),
        (
            "mem://",
            &["run", "job", "--timeout", "soon", "--", "true"],
            64,
        ),
    ];
    for (url, args, code) in cases {
        let out = output(url, args).await;
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(!text(&out.stderr).is_empty(), "{args:?} must say why");
    }
    let unreachable = format!(
        "etcd://127.0.0.1:{}?connect_timeout=1s",
        fencelock_testsupport::free_port()
    );
    let out = output(&unreachable, &["run", "job", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
}

/// A `fencelock` with no backend configured at all.
fn bare(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("FENCELOCK_BACKEND")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_backend_run_status_and_list_refuse_and_mem_warns() {
    for args in [
        &["run", "job", "--", "true"][..],
        &["status", "job"],
        &["list"],
    ] {
        let out = bare(args).output().await.unwrap();
        assert_eq!(
            out.status.code(),
            Some(64),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("--backend"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = output("mem://", &["run", "job", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("excludes nothing across processes"),
        "{}",
        text(&out.stderr)
    );
    let quiet = output("mem://", &["-q", "status", "job"]).await;
    assert_eq!(quiet.status.code(), Some(0));
    assert!(text(&quiet.stderr).is_empty(), "{}", text(&quiet.stderr));
    // `run --help` shows run's own exit codes.
    let help = bare(&["run", "--help"]).output().await.unwrap();
    assert!(
        text(&help.stdout).contains("Exit codes"),
        "{}",
        text(&help.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_is_printed_in_help_errors_or_logs() {
    const SECRET: &str = "pa55-w0rd-xyz";
    let unreachable = format!(
        "etcd://app:{SECRET}@127.0.0.1:{}/p?connect_timeout=1s",
        fencelock_testsupport::free_port()
    );
    let bad_url = format!("etcd://app:{SECRET}@127.0.0.1:2379/p?ttl=soon");
    let cases: [(&str, &[&str]); 6] = [
        (&unreachable, &["--help"]),
        (&unreachable, &["run", "--help"]),
        (&unreachable, &["-vv", "run", "job", "--", "true"]),
        (&unreachable, &["-vv", "status", "job"]),
        (&bad_url, &["run", "job", "--", "true"]),
        (&bad_url, &["list", "--json"]),
    ];
    for (url, args) in cases {
        let out = output(url, args).await;
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            !all.contains(SECRET),
            "{args:?} printed the password:\n{all}"
        );
        assert!(!all.is_empty(), "{args:?} printed nothing");
    }
}

/// Issue 15: `kill -9` of fencelock must not leave CMD running without the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmd_dies_with_a_sigkilled_fencelock() {
    let url = etcd_url();
    let dir = tmp_root().join(unique("pdeath"));
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = dir.join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut holder = fencelock(&url, &["run", "job", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let pid = wait_for_file(&pid_file).await;
    assert!(alive(&pid));
    holder.start_kill().unwrap(); // SIGKILL
    let _ = holder.wait().await;
    let start = std::time::Instant::now();
    // Bounded poll; the kernel sends the parent-death signal at once.
    while alive(&pid) && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!alive(&pid), "CMD outlived a SIGKILLed fencelock");
    eprintln!("CMD gone {:?} after fencelock's SIGKILL", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_exit_77() {
    let cluster = EtcdCluster::start(1);
    for args in [
        &["user", "add", "root:rootpw", "--interactive=false"][..],
        &["auth", "enable"],
    ] {
        cluster.etcdctl(args).unwrap();
    }
    let host = cluster.endpoints()[0]
        .trim_start_matches("http://")
        .to_owned();
    let good = format!("etcd://root:rootpw@{host}/cli-auth");
    let out = output(
        &good,
        &[
            "-v",
            "run",
            "job",
            "--",
            "sh",
            "-c",
            "env | grep FENCELOCK_",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("FENCELOCK_BACKEND=etcd://root:"),
        "{}",
        text(&out.stdout)
    );
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        !all.contains("rootpw"),
        "the password reached CMD or the log:\n{all}"
    );
    for url in [
        format!("etcd://root:wrong@{host}/cli-auth"),
        format!("etcd://{host}/cli-auth"),
    ] {
        let out = output(&url, &["run", "job", "--", "true"]).await;
        assert_eq!(out.status.code(), Some(77), "{url}: {}", text(&out.stderr));
        assert!(
            !text(&out.stderr).contains("wrong"),
            "the password is never printed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_shows_the_refused_write_and_the_lost_update() {
    let out = output("mem://", &["demo"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("REFUSED A's write"), "{stdout}");
    assert!(stdout.contains("B's deposit survived"), "{stdout}");
    assert!(stdout.contains("B's deposit is LOST"), "{stdout}");
    let out = output(&etcd_url(), &["demo"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("REFUSED A's write"),
        "{}",
        text(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_refuses_the_stale_write_at_a_real_postgres() {
    let pg = fencelock_testsupport::PgServer::start();
    let out = output("mem://", &["demo", "--resource", &pg.url()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("resource (PostgreSQL): REFUSED A's write"),
        "{stdout}"
    );
    assert!(
        stdout.contains("final balance 150 (100 + 50 deposit): B's deposit survived"),
        "{stdout}"
    );
    assert!(
        stdout.contains("final balance 70 (100 - 30 withdrawal): B's deposit is LOST"),
        "{stdout}"
    );
    let out = output("mem://", &["demo", "--resource", "mysql://x"]).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
}

/// An interactive CMD at a terminal (a pseudo-terminal from `script`) reads its answer: it gets
/// the terminal's foreground. In a background group its read would stop it with SIGTTIN, and
/// fencelock would hold the lock forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_cmd_gets_the_terminal() {
    let inner = format!(
        "{BIN} --backend mem:// -q run job -- sh -c 'printf \"name? \"; read x; echo got:$x'"
    );
    let mut script = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = script.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"bob\n")
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), script.wait_with_output())
        .await
        .expect("CMD was stopped reading the terminal (no foreground)")
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("got:bob"),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_the_man_page_come_from_the_cli_definition() {
    for (args, expect) in [
        (&["completions", "bash"][..], "_fencelock()"),
        (&["completions", "zsh"], "#compdef fencelock"),
        (&["completions", "fish"], "complete -c fencelock"),
        (&["man"], ".TH fencelock"),
    ] {
        let out = bare(args).output().await.unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let page = text(&out.stdout);
        assert!(page.contains(expect), "{args:?}: {expect:?} not in\n{page}");
        assert!(
            page.contains("status"),
            "{args:?} must cover the subcommands"
        );
    }
}

/// Issue 15.6: `break` removes a stuck holder's entry; the holder's `lost` fires and its CMD
/// is stopped (exit 76), and the waiter's CMD runs. On etcd and ZooKeeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_lets_the_waiter_in_and_stops_the_old_holders_command() {
    for url in [etcd_url(), zk_url()] {
        let dir = tmp_root().join(unique("break"));
        std::fs::create_dir_all(&dir).unwrap();
        let (started, waiter_ran) = (dir.join("started"), dir.join("waiter"));
        let holder_script = format!("echo go > {}; exec sleep 60", started.display());
        let holder = fencelock(
            &url,
            &[
                "run",
                "job",
                "--grace",
                "1s",
                "--",
                "sh",
                "-c",
                &holder_script,
            ],
        )
        .spawn()
        .unwrap();
        wait_for_file(&started).await;
        let waiter_script = format!("echo ran > {}", waiter_ran.display());
        let waiter = fencelock(&url, &["run", "job", "--", "sh", "-c", &waiter_script])
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !waiter_ran.exists(),
            "the waiter must wait while the holder holds"
        );
        let refused = output(&url, &["break", "job"]).await; // stdin is not a terminal
        assert_eq!(refused.status.code(), Some(64), "{}", text(&refused.stderr));
        let broke = output(&url, &["break", "job", "--yes"]).await;
        assert_eq!(broke.status.code(), Some(0), "{}", text(&broke.stderr));
        assert!(
            text(&broke.stdout).contains("removed the holder with token"),
            "{}",
            text(&broke.stdout)
        );
        assert_eq!(
            exit_code(holder).await,
            76,
            "{url}: the broken holder reports LOST"
        );
        assert_eq!(exit_code(waiter).await, 0, "{url}: the waiter runs");
        assert!(waiter_ran.exists());
    }
}

async fn next_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> String {
    tokio::time::timeout(BOUND, lines.next_line())
        .await
        .expect("a line")
        .unwrap()
        .unwrap()
}

/// Issue 19.2: `status --watch` follows the store's watch: a holder, a waiter joining (with
/// its owner), the handoff and free, each once and in order, on etcd and ZooKeeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_prints_each_change() {
    use tokio::io::AsyncBufReadExt;
    for url in [etcd_url(), zk_url()] {
        let dir = tmp_root().join(unique("watch"));
        std::fs::create_dir_all(&dir).unwrap();
        let (started, go) = (dir.join("started"), dir.join("go"));
        let mut watcher = fencelock(&url, &["status", "job", "--watch"])
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(watcher.stdout.take().unwrap()).lines();
        assert_eq!(next_line(&mut lines).await, "job: free");
        let script = format!(
            "echo $$ > {}; for i in $(seq 600); do [ -e {} ] && break; sleep 0.1; done",
            started.display(),
            go.display()
        );
        let holder = fencelock(&url, &["run", "--label", "a", "job", "--", "sh", "-c"])
            .arg(&script)
            .spawn()
            .unwrap();
        let line = next_line(&mut lines).await;
        assert!(line.starts_with("job: held by token "), "{line}");
        assert!(
            line.contains("(a pid ") && line.ends_with("; 0 waiting"),
            "{line}"
        );
        wait_for_file(&started).await;
        let waiter = fencelock(&url, &["run", "--label", "b", "job", "--", "sleep", "1"])
            .spawn()
            .unwrap();
        let line = next_line(&mut lines).await;
        assert!(
            line.contains("(a pid ") && line.ends_with("; 1 waiting"),
            "{line}"
        );
        let line = next_line(&mut lines).await;
        assert!(
            line.starts_with("  waiting: token ") && line.contains("(b pid "),
            "{line}"
        );
        std::fs::write(&go, "").unwrap();
        let line = next_line(&mut lines).await;
        assert!(
            line.contains("(b pid ") && line.ends_with("; 0 waiting"),
            "handoff: {line}"
        );
        assert_eq!(next_line(&mut lines).await, "job: free");
        assert_eq!(exit_code(holder).await, 0);
        assert_eq!(exit_code(waiter).await, 0);
        let pid = watcher.id().unwrap().to_string();
        std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap();
        assert_eq!(exit_code(watcher).await, 0);
    }
}

/// Issue 16.3: `elect` runs CMD while leader with the term as FENCELOCK_TOKEN; `leader` shows
/// the leader, and `leader --watch` each change, including "no leader". On etcd and ZooKeeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_runs_cmd_while_leader_and_leader_watch_follows() {
    use tokio::io::AsyncBufReadExt;
    for url in [etcd_url(), zk_url()] {
        let dir = tmp_root().join(unique("elect"));
        std::fs::create_dir_all(&dir).unwrap();
        let (a_term, b_term) = (dir.join("a"), dir.join("b"));
        let mut watcher = fencelock(&url, &["leader", "sched", "--watch"])
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(watcher.stdout.take().unwrap()).lines();
        assert_eq!(next_line(&mut lines).await, "sched: no leader");

        let a_script = format!(
            "echo $FENCELOCK_TOKEN > {}; exec sleep 30",
            a_term.display()
        );
        let a = fencelock(
            &url,
            &[
                "elect", "sched", "--value", "a", "--", "sh", "-c", &a_script,
            ],
        )
        .spawn()
        .unwrap();
        let term: u64 = wait_for_file(&a_term).await.trim().parse().unwrap();
        assert_eq!(
            next_line(&mut lines).await,
            format!("sched: led by a (term {term})")
        );
        let tried = output(
            &url,
            &["elect", "sched", "--value", "b", "--try", "--", "true"],
        )
        .await;
        assert_eq!(tried.status.code(), Some(75), "{}", text(&tried.stderr));
        let shown = text(&output(&url, &["leader", "sched", "--json"]).await.stdout);
        let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(shown["value"], "a");
        assert_eq!(shown["term"], term);

        let b_script = format!("echo $FENCELOCK_TOKEN > {}; sleep 1", b_term.display());
        let b = fencelock(
            &url,
            &[
                "elect", "sched", "--value", "b", "--", "sh", "-c", &b_script,
            ],
        )
        .spawn()
        .unwrap();
        // a resigns once b waits in the store, or the watcher would see no leader between.
        assert_eq!(
            until_waiting(&url, "sched", 1).await,
            1,
            "{url}: b must queue while a leads"
        );
        assert!(!b_term.exists(), "b must wait while a leads");
        // SIGTERM goes on to a's CMD; when it exits, a resigns.
        let pid = a.id().unwrap().to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert_eq!(exit_code(a).await, 143, "{url}: a's CMD died of SIGTERM");
        let next: u64 = wait_for_file(&b_term).await.trim().parse().unwrap();
        assert!(next > term, "{url}: b's term {next} must exceed a's {term}");
        assert_eq!(
            next_line(&mut lines).await,
            format!("sched: led by b (term {next})"),
            "{url}: a's term {term}"
        );
        assert_eq!(exit_code(b).await, 0);
        assert_eq!(next_line(&mut lines).await, "sched: no leader");
        let pid = watcher.id().unwrap().to_string();
        std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap();
        assert_eq!(exit_code(watcher).await, 0);
    }
}

/// Issue 19.3: a waiter's endpoint shows how many were queued ahead of it when it first looked,
/// on etcd and ZooKeeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_metrics_show_the_queue_ahead_of_it() {
    for (url, backend) in [(etcd_url(), "etcd"), (zk_url(), "zookeeper")] {
        let dir = tmp_root().join(unique("ahead"));
        std::fs::create_dir_all(&dir).unwrap();
        let (started, go) = (dir.join("started"), dir.join("go"));
        let script = format!(
            "echo $$ > {}; for i in $(seq 600); do [ -e {} ] && break; sleep 0.1; done",
            started.display(),
            go.display()
        );
        let holder = fencelock(&url, &["run", "job", "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        wait_for_file(&started).await;
        let second = fencelock(&url, &["run", "job", "--", "true"])
            .spawn()
            .unwrap();
        assert_eq!(
            until_waiting(&url, "job", 1).await,
            1,
            "the second must queue before the third starts"
        );
        let port = fencelock_testsupport::free_port();
        let listen = format!("127.0.0.1:{port}");
        let run = ["run", "--metrics-listen", &listen, "job", "--", "true"];
        let mut third = fencelock(&url, &run).spawn().unwrap();
        let count = format!(r#"fencelock_acquire_queue_ahead_count{{backend="{backend}"}}"#);
        let body = tokio::time::timeout(BOUND, async {
            loop {
                if let Some(body) = scrape(port).await {
                    if sample(&body, &count) == Some(1.0) {
                        return body;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("the waiter's first look shows at its endpoint");
        let sum = format!(r#"fencelock_acquire_queue_ahead_sum{{backend="{backend}"}}"#);
        // The holder and the second were queued ahead of the third.
        assert_eq!(sample(&body, &sum), Some(2.0), "{backend}: {body}");
        std::fs::write(&go, "").unwrap();
        assert_eq!(exit_code(holder).await, 0);
        assert_eq!(exit_code(second).await, 0);
        let _ = third.stdout.take();
        assert_eq!(exit_code(third).await, 0);
    }
}

/// One GET of the metrics endpoint: the body, or `None` when nothing answers.
async fn scrape(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
        .await
        .ok()?
        .ok()?;
    Some(response)
}

/// The value of the sample line that starts with `series` (name and labels).
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_serves_metrics_with_the_margin_left_and_the_loss_after_a_black_hole() {
    let proxy = TcpProxy::start(
        etcd().endpoints()[0]
            .trim_start_matches("http://")
            .to_owned(),
    )
    .await;
    let url = format!(
        "etcd://127.0.0.1:{}/{}?ttl=2s",
        proxy.port,
        unique("metrics")
    );
    let port = fencelock_testsupport::free_port();
    let listen = format!("127.0.0.1:{port}");
    let dir = tmp_root().join(unique("metrics"));
    std::fs::create_dir_all(&dir).unwrap();
    let pid = dir.join("pid");
    // CMD ignores SIGTERM, so fencelock (and its endpoint) lives on for the grace after the loss.
    let script = format!("trap '' TERM; echo $$ > {}; sleep 60", pid.display());
    let child = fencelock(
        &url,
        &[
            "run",
            "--metrics-listen",
            &listen,
            "--grace",
            "5s",
            "job",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .spawn()
    .unwrap();
    wait_for_file(&pid).await;
    // Two renewals at least (every ttl/3).
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let body = scrape(port).await.expect("the endpoint answers");
    let granted = r#"fencelock_acquires_total{backend="etcd",outcome="granted"}"#;
    assert_eq!(sample(&body, granted), Some(1.0), "{body}");
    let margin = sample(
        &body,
        r#"fencelock_renewal_margin_seconds{backend="etcd",quantile="0.5"}"#,
    );
    // ttl 2 s, renewed every 0.67 s: about 1.3 s left, minus the margin, at each answer.
    assert!(margin.is_some_and(|m| m > 0.3 && m < 2.0), "{body}");
    assert!(
        body.contains("# HELP fencelock_renewal_margin_seconds"),
        "{body}"
    );

    // Uncontended: nothing was queued ahead of it.
    let ahead = r#"fencelock_acquire_queue_ahead_count{backend="etcd"}"#;
    assert_eq!(sample(&body, ahead), Some(1.0), "{body}");
    let ahead = r#"fencelock_acquire_queue_ahead_sum{backend="etcd"}"#;
    assert_eq!(sample(&body, ahead), Some(0.0), "{body}");

    proxy.set_mode(ProxyMode::BlackHole);
    let lost = r#"fencelock_losses_total{cause="deadline"}"#;
    let seen = tokio::time::timeout(BOUND, async {
        loop {
            if let Some(body) = scrape(port).await {
                if sample(&body, lost) == Some(1.0) {
                    return body;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the loss shows at the endpoint");
    assert!(
        sample(
            &seen,
            r#"fencelock_renewals_total{backend="etcd",outcome="failed"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "{seen}"
    );
    assert_eq!(exit_code(child).await, 76);
}

/// `run --permits 2`: two commands run at once, a third waits (and a try exits 75), a count of
/// 3 is refused (64), `status --permits` names holders and the waiter, and a killed holder's
/// permit passes to the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_permits_runs_n_commands_at_once() {
    for url in [etcd_url(), zk_url()] {
        let dir = tmp_root().join(unique("permits"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut holders = Vec::new();
        for i in 0..2 {
            let started = dir.join(format!("started{i}"));
            let script = format!("echo $$ > {}; sleep 30", started.display());
            let label = format!("p{i}");
            let holder = fencelock(&url, &["run", "--permits", "2", "--label", &label, "pool"])
                .args(["--", "sh", "-c", &script])
                .spawn()
                .unwrap();
            wait_for_file(&started).await;
            holders.push(holder);
        }
        let tried = output(
            &url,
            &["run", "--permits", "2", "--try", "pool", "--", "true"],
        )
        .await;
        assert_eq!(tried.status.code(), Some(75), "{}", text(&tried.stderr));
        let other = output(
            &url,
            &["run", "--permits", "3", "--try", "pool", "--", "true"],
        )
        .await;
        assert_eq!(other.status.code(), Some(64), "{}", text(&other.stderr));
        assert!(
            text(&other.stderr).contains("has 2 permits"),
            "{}",
            text(&other.stderr)
        );
        let ran = dir.join("ran");
        let script = format!("echo $FENCELOCK_TOKEN > {}", ran.display());
        let waiter = fencelock(&url, &["run", "--permits", "2", "--label", "w", "pool"])
            .args(["--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        let mut seen = serde_json::Value::Null;
        for _ in 0..100 {
            let out = output(&url, &["status", "--permits", "pool", "--json"]).await;
            seen = serde_json::from_slice(&out.stdout).unwrap();
            if seen["waiting"] == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            (&seen["holders"], &seen["permits"]),
            (&2.into(), &2.into()),
            "{seen}"
        );
        assert_eq!(seen["waiting"], 1, "{seen}");
        let labels: Vec<&str> = (0..3)
            .map(|i| seen["queue"][i]["owner"]["label"].as_str().unwrap_or("?"))
            .collect();
        assert_eq!(labels, ["p0", "p1", "w"], "{seen}");
        let line = text(&output(&url, &["status", "--permits", "pool"]).await.stdout);
        assert!(
            line.starts_with("pool: 2 of 2 permits held; 1 waiting"),
            "{line}"
        );
        assert!(
            line.contains("\n  waiting: token ") && line.contains("(w pid "),
            "{line}"
        );
        assert!(!ran.exists(), "the third command must wait");
        drop(holders.remove(0)); // SIGKILL: its permit returns when its lease ends
        let token = wait_for_file(&ran).await;
        assert!(token.trim().parse::<u64>().is_ok_and(|t| t > 0), "{token}");
        assert_eq!(exit_code(waiter).await, 0);
        drop(holders);
    }
}

/// `run --read` twice: both commands run at once, and `--write --try` exits 75; a waiting
/// writer runs once both readers are done, with a greater token, and a reader that tries while
/// it writes exits 75.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_read_and_write_share_and_exclude() {
    for url in [etcd_url(), zk_url()] {
        let dir = tmp_root().join(unique("rw"));
        std::fs::create_dir_all(&dir).unwrap();
        // Each command runs until its `stop` file appears (at most 30 s), then ends by itself.
        let until = |stop: &std::path::Path| {
            format!(
                "for i in $(seq 300); do [ -e {} ] && break; sleep 0.1; done",
                stop.display()
            )
        };
        let stop_readers = dir.join("stop-readers");
        let mut readers = Vec::new();
        for i in 0..2 {
            let started = dir.join(format!("read{i}"));
            let script = format!(
                "echo $FENCELOCK_TOKEN > {}; {}",
                started.display(),
                until(&stop_readers)
            );
            let reader = fencelock(&url, &["run", "--read", "config"])
                .args(["--", "sh", "-c", &script])
                .spawn()
                .unwrap();
            wait_for_file(&started).await;
            readers.push(reader);
        }
        let tried = output(&url, &["run", "--write", "--try", "config", "--", "true"]).await;
        assert_eq!(tried.status.code(), Some(75), "{}", text(&tried.stderr));
        let (wrote, stop_writer) = (dir.join("wrote"), dir.join("stop-writer"));
        let script = format!(
            "echo $FENCELOCK_TOKEN > {}; {}",
            wrote.display(),
            until(&stop_writer)
        );
        let writer = fencelock(&url, &["run", "--write", "config"])
            .args(["--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        let mut seen = serde_json::Value::Null;
        for _ in 0..100 {
            let out = output(&url, &["status", "config", "--json"]).await;
            seen = serde_json::from_slice(&out.stdout).unwrap();
            if seen["waiting"] == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let sides: Vec<&str> = (0..3)
            .map(|i| seen["queue"][i]["access"].as_str().unwrap_or("?"))
            .collect();
        assert_eq!(
            (&seen["holders"], &seen["waiting"], sides),
            (&2.into(), &1.into(), vec!["read", "read", "write"]),
            "{seen}"
        );
        let line = text(&output(&url, &["status", "config"]).await.stdout);
        assert!(
            line.starts_with("config: 2 readers hold it; 1 waiting")
                && line.contains("\n  waiting to write: token "),
            "{line}"
        );
        assert!(!wrote.exists(), "the writer must wait for the readers");
        std::fs::write(&stop_readers, "").unwrap();
        for reader in readers {
            assert_eq!(exit_code(reader).await, 0);
        }
        let token: u64 = wait_for_file(&wrote).await.trim().parse().unwrap();
        for i in 0..2 {
            let read: u64 = std::fs::read_to_string(dir.join(format!("read{i}")))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            assert!(
                token > read,
                "a writer's token exceeds the readers' before it"
            );
        }
        let tried = output(&url, &["run", "--read", "--try", "config", "--", "true"]).await;
        assert_eq!(tried.status.code(), Some(75), "{}", text(&tried.stderr));
        std::fs::write(&stop_writer, "").unwrap();
        assert_eq!(exit_code(writer).await, 0);
    }
}
