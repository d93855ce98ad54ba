//! Test support for fencelock: real servers on free loopback ports, and a fault proxy.
//!
//! Servers keep their data and logs under [`tmp_root`] (`$FENCELOCK_TEST_TMP` when set, which
//! `scripts/test` reaps afterwards). Each server has a watchdog that kills it when the test
//! process exits, so a server shared through a `static` never outlives its test binary, and
//! then deletes its folder (kept when `FENCELOCK_TEST_KEEP` is set). A server that fails to
//! start panics with its log.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a panic is the report

mod curator;
mod etcd;
mod postgres;
mod process;
mod proxy;
mod tls;
mod zk_proxy;
mod zookeeper;

pub use curator::{compile_java, curator_classpath, JavaProgram};
pub use etcd::{EtcdCluster, EtcdMember, COMPOSE_ETCD_ENDPOINTS, ETCD_ENV};
pub use postgres::PgServer;
pub use process::{free_port, tmp_root, unique};
pub use proxy::{ProxyMode, TcpProxy};
pub use tls::TlsFiles;
pub use zk_proxy::{zk_op, ZkFrameProxy};
pub use zookeeper::{
    four_letter, PeerLinks, ZkEnsemble, ZkMember, COMPOSE_ZK_CONNECT, TICK as ZK_TICK, ZK_ENV,
};
