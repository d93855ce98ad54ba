//! Fencing at the resource: the checks that make a resource refuse writes from a stale
//! [fencelock](https://docs.rs/fencelock) holder.
//!
//! - In memory, in one process: [`fencelock::Fence`] (re-exported here).
//! - **PostgreSQL** (feature `postgres`): [`postgres::PgFence`], a fence table whose check runs
//!   in *your* transaction, so the check and your write commit together or not at all, or
//!   inside your statement itself ([`postgres::PgFence::condition`]). The fence survives
//!   restarts and is shared by every replica that uses the database.
//! - [`FenceStore`]: where a resource keeps its marks and holds admissions, with the memory
//!   ([`Fence`]) and PostgreSQL ([`postgres::PgFenceStore`]) implementations, and what an
//!   implementation for Redis, DynamoDB or a file must guarantee.
//! - **HTTP** (feature `tower`): [`http::FenceLayer`] fences every request of an axum or hyper
//!   service through a `FenceStore` (`409 Conflict` with the cause on a stale token), and
//!   [`http::StampLayer`]/[`http::Stamp`] put the header on a client's requests from a guard.
//!
//! Why tokio-postgres and not sqlx: the fence needs one upsert and a transaction the caller
//! owns; tokio-postgres gives both with a small dependency tree and no compile-time database,
//! and its `GenericClient` lets the fence run on a plain client, a transaction or a pooled
//! connection (deadpool-postgres, bb8) alike.
#![forbid(unsafe_code)]

pub use fencelock::{Fence, FenceMode, FencePermit, FencingToken};

mod store;
pub use store::{Admission, FenceStore};

#[cfg(feature = "tower")]
pub mod http;
#[cfg(feature = "postgres")]
pub mod postgres;
