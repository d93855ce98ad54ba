//! The conformance suite against a standalone ZooKeeper.
mod common;

fencelock::conformance_tests!(common::ZkFactory::on(common::shared_standalone()).await);
