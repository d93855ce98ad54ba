//! Fencing at the resource: the checks that make a resource refuse writes from a stale
//! [fencelock](https://docs.rs/fencelock) holder.
//!
//! - In memory, in one process: [`fencelock::Fence`] (re-exported here).
//! - **PostgreSQL** (feature `postgres`): [`postgres::PgFence`], a fence table whose check runs
//!   in *your* transaction, so the check and your write commit together or not at all. The fence
//!   survives restarts and is shared by every replica that uses the database.
//!
//! Why tokio-postgres and not sqlx: the fence needs one upsert and a transaction the caller
//! owns; tokio-postgres gives both with a small dependency tree and no compile-time database,
//! and its `GenericClient` lets the fence run on a plain client, a transaction or a pooled
//! connection (deadpool-postgres, bb8) alike.
#![forbid(unsafe_code)]

pub use fencelock::{Fence, FenceMode, FencePermit, FencingToken};

#[cfg(feature = "postgres")]
pub mod postgres;
