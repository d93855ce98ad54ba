//! The conformance suite against a 3-node ZooKeeper ensemble (clients know all three servers).
mod common;

fencelock::conformance_tests!(common::ZkFactory::on(common::shared_ensemble()).await);
