//! `fencelock`: run a command under a fenced distributed lock, inspect locks, see the demo.
#![forbid(unsafe_code)]

mod demo;
mod exit;
mod run;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use fencelock::{LockName, Wait};

/// Distributed locks you can trust: a lease plus a fencing token.
#[derive(Parser, Debug)]
#[command(name = "fencelock", version, after_help = exit::HELP)]
struct Cli {
    /// Backend URL: etcd://host:2379/prefix, etcds://..., zk://host:2181/base, mem://
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_BACKEND",
        default_value = "mem://"
    )]
    backend: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Wait for lock NAME, run CMD while holding it, stop CMD if the lock is lost.
    Run {
        /// The lock's name.
        name: String,
        /// Give up after waiting this long (e.g. 30s, 500ms, 2m).
        #[arg(long, value_parser = parse_duration, conflicts_with = "try_once")]
        timeout: Option<Duration>,
        /// Do not wait: exit 75 at once if the lock is held.
        #[arg(long = "try")]
        try_once: bool,
        /// After the lock is lost, how long CMD has between SIGTERM and SIGKILL.
        #[arg(long, value_parser = parse_duration, default_value = "5s")]
        grace: Duration,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
    /// Show who holds lock NAME and how many wait.
    Status {
        /// The lock's name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List locks that are held or waited for.
    List {
        /// Only names starting with this.
        #[arg(default_value = "")]
        prefix: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show why a lease needs a fencing token, in under a minute.
    Demo,
    /// (internal) The demo's worker A, run as a separate process so it can really be paused.
    #[command(hide = true)]
    DemoWorker {
        /// The lock's name.
        name: String,
    },
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
            timeout,
            try_once,
            grace,
            command,
        } => {
            let name = match name(&raw) {
                Ok(name) => name,
                Err(code) => return code,
            };
            let wait = match (try_once, timeout) {
                (true, _) => Wait::Try,
                (false, Some(limit)) => Wait::Timeout(limit),
                (false, None) => Wait::Forever,
            };
            run::run(&cli.backend, &name, wait, grace, &command).await
        }
        Command::Status { name: raw, json } => match name(&raw) {
            Ok(name) => run::status(&cli.backend, &name, json).await,
            Err(code) => code,
        },
        Command::List { prefix, json } => run::list(&cli.backend, &prefix, json).await,
        Command::Demo => demo::demo(&cli.backend).await,
        Command::DemoWorker { name: raw } => match name(&raw) {
            Ok(name) => demo::worker(&cli.backend, &name).await,
            Err(code) => code,
        },
    }
}
