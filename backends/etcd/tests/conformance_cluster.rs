//! The conformance suite against a 3-node etcd cluster (clients know all three endpoints).
mod common;

fencelock::conformance_tests!(common::EtcdFactory::on(common::shared_cluster()).await);
