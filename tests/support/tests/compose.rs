//! docker-compose.yml must match what the tests read: Docker is not on our CI machines, so this
//! checks the file itself against the variables and defaults in the test support.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fencelock_testsupport::{
    COMPOSE_ETCD_ENDPOINTS, COMPOSE_ZK_CONNECT, ETCD_ENV, ZK_ENV, ZK_TICK,
};
use serde_yaml::Value;

fn compose() -> (String, Value) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docker-compose.yml");
    let text = std::fs::read_to_string(path).expect("docker-compose.yml at the repository root");
    let mut value: Value = serde_yaml::from_str(&text).expect("valid YAML");
    value.apply_merge().expect("merge keys resolve");
    (text, value)
}

fn services<'a>(compose: &'a Value, prefix: &str) -> Vec<(&'a str, &'a Value)> {
    let mut found: Vec<(&str, &Value)> = compose["services"]
        .as_mapping()
        .expect("services")
        .iter()
        .filter_map(|(k, v)| Some((k.as_str()?, v)))
        .filter(|(k, _)| k.starts_with(prefix))
        .collect();
    found.sort_by_key(|(k, _)| *k);
    found
}

/// The host side of the service's one published port, which must be on loopback.
fn host_port(service: &Value) -> String {
    let ports = service["ports"].as_sequence().expect("ports");
    assert_eq!(ports.len(), 1);
    let spec = ports[0].as_str().expect("port as a string");
    let (address, rest) = spec.split_once(':').expect("address:host:container");
    assert_eq!(address, "127.0.0.1", "publish on loopback only: {spec}");
    rest.split(':').next().unwrap().to_owned()
}

fn env<'a>(service: &'a Value, key: &str) -> &'a str {
    service["environment"][key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} missing"))
}

fn check_common(name: &str, service: &Value) {
    let image = service["image"].as_str().expect("image");
    let (_, tag) = image
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{name}: pin the image: {image}"));
    assert!(
        tag != "latest"
            && tag
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit() || c == 'v'),
        "{name}: {image}"
    );
    assert!(
        service["healthcheck"]["test"]
            .as_sequence()
            .is_some_and(|t| !t.is_empty()),
        "{name}: health check"
    );
}

#[test]
fn etcd_cluster_matches_the_test_defaults() {
    let (text, compose) = compose();
    let etcd = services(&compose, "etcd");
    assert_eq!(etcd.len(), 3, "a 3-node etcd cluster");
    let mut endpoints = Vec::new();
    for (name, service) in &etcd {
        check_common(name, service);
        let url = format!("http://127.0.0.1:{}", host_port(service));
        assert_eq!(
            env(service, "ETCD_ADVERTISE_CLIENT_URLS"),
            url,
            "{name} advertises its host URL"
        );
        assert_eq!(env(service, "ETCD_NAME"), *name);
        let cluster = env(service, "ETCD_INITIAL_CLUSTER");
        for (peer, _) in &etcd {
            assert!(
                cluster.contains(&format!("{peer}=http://{peer}:2380")),
                "{name}: {cluster}"
            );
        }
        endpoints.push(url);
    }
    assert_eq!(endpoints.join(","), COMPOSE_ETCD_ENDPOINTS);
    assert!(
        text.contains(&format!("{ETCD_ENV}={COMPOSE_ETCD_ENDPOINTS}")),
        "the header says what to export"
    );
}

#[test]
fn zookeeper_ensemble_matches_the_test_defaults() {
    let (text, compose) = compose();
    let zk = services(&compose, "zk");
    assert_eq!(zk.len(), 3, "a 3-node ZooKeeper ensemble");
    let mut connect = Vec::new();
    for (i, (name, service)) in zk.iter().enumerate() {
        check_common(name, service);
        assert_eq!(env(service, "ZOO_MY_ID"), (i + 1).to_string());
        // Session bounds (2 to 20 ticks) that the tests rely on.
        assert_eq!(
            env(service, "ZOO_TICK_TIME"),
            ZK_TICK.as_millis().to_string()
        );
        let servers = env(service, "ZOO_SERVERS");
        assert_eq!(servers.split_whitespace().count(), 3, "{servers}");
        let whitelist = env(service, "ZOO_4LW_COMMANDS_WHITELIST");
        for command in ["ruok", "srvr", "cons"] {
            assert!(
                whitelist.contains(command),
                "{name}: the tests use `{command}`"
            );
        }
        connect.push(format!("127.0.0.1:{}", host_port(service)));
    }
    assert_eq!(connect.join(","), COMPOSE_ZK_CONNECT);
    assert!(
        text.contains(&format!("{ZK_ENV}={COMPOSE_ZK_CONNECT}")),
        "the header says what to export"
    );
}
