//! The conformance suite against a single etcd node.
mod common;

fencelock::conformance_tests!(common::EtcdFactory::on(common::shared_single()).await);
