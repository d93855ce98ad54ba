//! `fencelock`: run a command under a fenced distributed lock, inspect locks, see the demo.
#![forbid(unsafe_code)]

mod child;
mod demo;
#[cfg(feature = "postgres")]
mod demo_pg;
mod elect;
mod exit;
mod logging;
mod metrics;
mod run;
mod terminal;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use fencelock::{Access, LockName, Wait};

/// Distributed locks you can trust: a lease plus a fencing token.
#[derive(Parser, Debug)]
#[command(name = "fencelock", version, after_help = exit::HELP)]
struct Cli {
    /// Backend URL: etcd://host:2379/prefix, etcds://..., zk://host:2181/base; mem:// excludes
    /// only within one process. Needed by run, status and list.
    #[arg(long, global = true, env = "FENCELOCK_BACKEND", hide_env_values = true)]
    backend: Option<String>,
    /// More log lines on stderr: -v info, -vv debug (FENCELOCK_LOG or RUST_LOG set a filter).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Only errors on stderr (for cron).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

/// How `run` and `elect` wait, and the CMD they supervise.
#[derive(clap::Args, Debug)]
struct Supervised {
    /// Give up after waiting this long (e.g. 30s, 500ms, 1m30s, 1.5s).
    #[arg(long, value_parser = parse_duration, conflicts_with = "try_once")]
    timeout: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock is held (for `elect`: if there is a leader).
    #[arg(long = "try")]
    try_once: bool,
    /// After the lock (or leadership) is lost, how long CMD has between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    grace: Duration,
    /// Serve fencelock's metrics (acquire wait, renewal round trip and margin left, losses...)
    /// in Prometheus text format at http://ADDR/ while running (e.g. 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// A free-form label recorded with this process's entry (with host, pid and start time),
    /// shown by `fencelock status` (e.g. a role, a pod or a job id).
    #[arg(long)]
    label: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "CMD")]
    command: Vec<String>,
}

impl Supervised {
    /// The backend URL with the `--label`, if one was given.
    fn url(&self, url: &str) -> String {
        match &self.label {
            Some(label) => fencelock_connect::with_setting(url, "label", label),
            None => url.to_owned(),
        }
    }

    fn wait(&self) -> Wait {
        match (self.try_once, self.timeout) {
            (true, _) => Wait::Try,
            (false, Some(limit)) => Wait::Timeout(limit),
            (false, None) => Wait::Forever,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Wait for lock NAME, run CMD while holding it, stop CMD if the lock is lost.
    #[command(after_help = exit::RUN_HELP)]
    Run {
        /// The lock's name (with --permits: the semaphore's).
        name: String,
        /// Take one of N permits of semaphore NAME instead of the lock: at most N CMDs run at
        /// once, across every host (like `consul lock -n N`). On ZooKeeper the semaphore is
        /// Curator's InterProcessSemaphoreV2; every contender must give the same N.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        permits: Option<u32>,
        /// Take reader-writer lock NAME as a reader: readers run side by side, while no writer
        /// does. Arrival order: a reader that comes after a waiting writer waits for it. On
        /// ZooKeeper it is Curator's InterProcessReadWriteLock.
        #[arg(long, conflicts_with_all = ["permits", "write"])]
        read: bool,
        /// Take reader-writer lock NAME as a writer: alone, with no reader and no other writer.
        #[arg(long, conflicts_with = "permits")]
        write: bool,
        #[command(flatten)]
        cmd: Supervised,
    },
    /// Campaign in election NAME, run CMD while leader, stop CMD if the leadership is lost.
    ///
    /// CMD gets the leadership's term as FENCELOCK_TOKEN (strictly greater than every earlier
    /// leader's): pass it to what CMD writes to. Interoperates with `etcdctl elect` and
    /// Curator's LeaderLatch on the same election.
    #[command(after_help = exit::RUN_HELP)]
    Elect {
        /// The election's name.
        name: String,
        /// What the leader publishes to observers (`fencelock leader`, `etcdctl elect -l`,
        /// Curator's participant id). Default: HOSTNAME/PID.
        #[arg(long)]
        value: Option<String>,
        #[command(flatten)]
        cmd: Supervised,
    },
    /// Show the leader of election NAME (its value and term).
    #[command(after_help = exit::HELP)]
    Leader {
        /// The election's name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Keep printing a line at each change of leader or value until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Show who holds lock NAME and how many wait.
    #[command(after_help = exit::HELP)]
    Status {
        /// The lock's name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Keep printing the status at each change of holder or queue until interrupted (the
        /// store's own watch: it survives reconnects and etcd compaction).
        #[arg(long, conflicts_with = "permits")]
        watch: bool,
        /// NAME is a semaphore (`run --permits`): show its permit holders and waiters.
        #[arg(long)]
        permits: bool,
    },
    /// Remove the current holder's entry of lock NAME, so the next contender proceeds.
    ///
    /// For a holder that is stuck but still renews. Its `lost` fires (a `fencelock run` stops
    /// its CMD) and the store refuses its fenced writes; resources that check the token refuse
    /// the rest.
    #[command(after_help = exit::HELP)]
    Break {
        /// The lock's name.
        name: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// List locks that are held or waited for, each with its holder and waiters as `status`
    /// shows them.
    #[command(after_help = exit::HELP)]
    List {
        /// Only names starting with this.
        #[arg(default_value = "")]
        prefix: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show why a lease needs a fencing token, in under a minute.
    Demo {
        /// Keep the demo's balance in this PostgreSQL (`postgres://user@host:port/db`) and fence
        /// it there with `fencelock-fence`'s `PgFence`, instead of in memory.
        #[arg(long, value_name = "URL")]
        resource: Option<String>,
    },
    /// Print a shell completion script: `fencelock completions bash > /etc/bash_completion.d/fencelock`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `fencelock man > /usr/local/share/man/man1/fencelock.1`.
    Man,
    /// (internal) The demo's worker A, run as a separate process so it can really be paused.
    #[command(hide = true)]
    DemoWorker {
        /// The lock's name.
        name: String,
    },
    /// (internal) Becomes CMD after arranging to die with fencelock (`run` starts it).
    #[command(hide = true)]
    ExecChild {
        /// fencelock's process id: if it is already gone, CMD is not started.
        parent: u32,
        /// CMD and its arguments.
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
}

/// The backend URL `run`, `status` and `list` need, or exit 64 saying how to name one.
fn required(backend: Option<&str>) -> Result<&str, u8> {
    backend.ok_or_else(|| {
        eprintln!(
            "fencelock: no backend named: pass --backend URL or set FENCELOCK_BACKEND, e.g. \
             etcd://127.0.0.1:2379/fencelock or zk://127.0.0.1:2181/fencelock (mem:// excludes \
             only within one process)"
        );
        exit::USAGE
    })
}

fn parse_duration(value: &str) -> Result<Duration, String> {
    fencelock_connect::parse_duration(value).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if let Command::ExecChild { parent, command } = &cli.command {
        // Before any runtime or thread: this process only arranges its death and execs CMD.
        return ExitCode::from(child::exec(*parent, command));
    }
    logging::init(cli.verbose, cli.quiet);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("fencelock: cannot start: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    ExitCode::from(runtime.block_on(dispatch(cli)))
}

async fn dispatch(cli: Cli) -> u8 {
    let name = |raw: &str| LockName::new(raw).map_err(|e| exit::report(&e));
    match cli.command {
        Command::Run {
            name: raw,
            permits,
            read,
            write,
            cmd,
        } => match (name(&raw), required(cli.backend.as_deref())) {
            (Ok(name), Ok(url)) => {
                if let Some(Err(code)) = cmd.metrics_listen.map(metrics::serve) {
                    return code;
                }
                let seek = match (permits, read, write) {
                    (Some(permits), ..) => run::Seek::Permit(permits),
                    (None, true, _) => run::Seek::Rw(Access::Read),
                    (None, _, true) => run::Seek::Rw(Access::Write),
                    (None, false, false) => run::Seek::Lock,
                };
                let seek = (&name, seek);
                let url = cmd.url(url);
                run::run(&url, seek, cmd.wait(), cmd.grace, &cmd.command).await
            }
            (Err(code), _) | (_, Err(code)) => code,
        },
        Command::Elect {
            name: raw,
            value,
            cmd,
        } => match (name(&raw), required(cli.backend.as_deref())) {
            (Ok(name), Ok(url)) => {
                if let Some(Err(code)) = cmd.metrics_listen.map(metrics::serve) {
                    return code;
                }
                let seek = run::Seek::Leadership(value.unwrap_or_else(elect::default_value));
                let url = cmd.url(url);
                run::run(&url, (&name, seek), cmd.wait(), cmd.grace, &cmd.command).await
            }
            (Err(code), _) | (_, Err(code)) => code,
        },
        Command::Leader {
            name: raw,
            json,
            watch,
        } => match (name(&raw), required(cli.backend.as_deref())) {
            (Ok(name), Ok(url)) => elect::leader(url, &name, json, watch).await,
            (Err(code), _) | (_, Err(code)) => code,
        },
        Command::Status {
            name: raw,
            json,
            watch,
            permits,
        } => match (name(&raw), required(cli.backend.as_deref())) {
            (Ok(name), Ok(url)) if watch => run::watch(url, &name, json).await,
            (Ok(name), Ok(url)) => run::status(url, &name, json, permits).await,
            (Err(code), _) | (_, Err(code)) => code,
        },
        Command::Break { name: raw, yes } => match (name(&raw), required(cli.backend.as_deref())) {
            (Ok(name), Ok(url)) => run::break_lock(url, &name, yes).await,
            (Err(code), _) | (_, Err(code)) => code,
        },
        Command::List { prefix, json } => match required(cli.backend.as_deref()) {
            Ok(url) => run::list(url, &prefix, json).await,
            Err(code) => code,
        },
        // The demo is the one command that runs in memory by default: it shows a lease alone.
        Command::Demo { resource } => {
            demo::demo(
                cli.backend.as_deref().unwrap_or("mem://"),
                resource.as_deref(),
            )
            .await
        }
        Command::DemoWorker { name: raw } => match name(&raw) {
            Ok(name) => demo::worker(cli.backend.as_deref().unwrap_or("mem://"), &name).await,
            Err(code) => code,
        },
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "fencelock",
                &mut std::io::stdout(),
            );
            0
        }
        Command::Man => {
            match clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("fencelock: cannot write the man page: {e}");
                    exit::SOFTWARE
                }
            }
        }
        Command::ExecChild { .. } => exit::SOFTWARE, // handled in `main`
    }
}
