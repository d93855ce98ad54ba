//! fencelock's fault-injection correctness suite.
//!
//! Contenders are separate processes (`contender` binary) that hold the lock (or lead the
//! election) in turn and
//! increment a value kept by a [`Register`] in the test process, which logs every event with the
//! time it arrived. Between the contenders and the servers sit proxies of our own, one per
//! contender and server, so one contender can be partitioned; holders are paused with SIGSTOP.
//! The [`check`] of the log counts violations, which must be zero with fencing, and which the
//! control run without fencing must show.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a panic is the report

mod checker;
mod harness;
mod register;

pub use checker::{check, holders, rw_holders, Holders, Report, RwHolders};
pub use harness::{Backend, Fault, Harness, Primitive, Schedule, PERMITS};
pub use register::{Event, Kind, Register};
