//! A three-node Apache Kafka cluster on loopback (three JVMs, each broker
//! and KRaft controller), for the tests of a cluster that loses a node:
//! `scripts/kafka` per node with a shared cluster id and quorum. Killed on
//! drop.

use std::path::Path;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::time::Duration;

/// The cluster's nodes, each with its first port and its process.
pub struct KafkaCluster {
    nodes: Vec<Node>,
    cluster_id: String,
    voters: String,
    dir: tempfile::TempDir,
}

struct Node {
    id: u32,
    port: u16,
    child: Option<std::process::Child>,
}

impl KafkaCluster {
    /// Starts `size` nodes and waits until each answers.
    pub async fn start(size: u32) -> KafkaCluster {
        let ports: Vec<u16> = (0..size).map(|_| super::ports::free_ports(4)).collect();
        let voters = ports
            .iter()
            .zip(1..)
            .map(|(port, id)| format!("{id}@127.0.0.1:{}", port + 3))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = KafkaCluster {
            nodes: ports
                .into_iter()
                .zip(1..)
                .map(|(port, id)| Node {
                    id,
                    port,
                    child: None,
                })
                .collect(),
            // Kafka's cluster ids are 16 bytes, base64url without padding.
            cluster_id: "cG9zYnJpZGdlLXRlc3QtMw".into(),
            voters,
            dir: tempfile::tempdir().unwrap(),
        };
        for index in 0..cluster.nodes.len() {
            cluster.spawn(index);
        }
        for index in 0..cluster.nodes.len() {
            cluster.wait(index).await;
        }
        cluster
    }

    /// Every node's PLAINTEXT listener, as `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `topic`'s partition 0: its leader's node id and how many replicas it has.
    fn partition(&self, topic: &str) -> (i32, usize) {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .unwrap();
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .unwrap();
        let partition = &metadata.topics()[0].partitions()[0];
        (partition.leader(), partition.replicas().len())
    }

    /// The node id that leads `topic`'s partition 0.
    pub fn leader_of(&self, topic: &str) -> u32 {
        u32::try_from(self.partition(topic).0).expect("a leader")
    }

    /// `topic`'s replicas (of partition 0) and its `min.insync.replicas`.
    pub async fn durability_of(&self, topic: &str) -> (usize, String) {
        let replicas = self.partition(topic).1;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .unwrap();
        let described = admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new())
            .await
            .unwrap();
        let resource = described.into_iter().next().unwrap().unwrap();
        let min_insync = resource
            .get("min.insync.replicas")
            .and_then(|entry| entry.value.clone())
            .unwrap_or_default();
        (replicas, min_insync)
    }

    /// Kills node `id` (SIGKILL), as a lost machine.
    pub fn kill(&mut self, id: u32) {
        let node = self.node(id);
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed node again on its data and waits until it answers.
    pub async fn restart(&mut self, id: u32) {
        self.kill(id);
        let index = self.nodes.iter().position(|n| n.id == id).unwrap();
        self.spawn(index);
        self.wait(index).await;
    }

    fn node(&mut self, id: u32) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.id == id).expect("a node")
    }

    fn spawn(&mut self, index: usize) {
        let node = &self.nodes[index];
        let dir = self.dir.path().join(format!("node-{}", node.id));
        let log =
            std::fs::File::create(self.dir.path().join(format!("node-{}.out", node.id))).unwrap();
        let child =
            std::process::Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka"))
                .arg(node.port.to_string())
                .arg(&dir)
                .args([
                    "offsets.topic.replication.factor=3",
                    "transaction.state.log.replication.factor=3",
                    "transaction.state.log.min.isr=2",
                    "default.replication.factor=3",
                    "min.insync.replicas=2",
                    // A lost leader is noticed within seconds, not the default 9.
                    "broker.session.timeout.ms=3000",
                    "broker.heartbeat.interval.ms=500",
                ])
                .env("POSBRIDGE_KAFKA_NODE_ID", node.id.to_string())
                .env("POSBRIDGE_KAFKA_VOTERS", &self.voters)
                .env("POSBRIDGE_KAFKA_CLUSTER_ID", &self.cluster_id)
                .env("POSBRIDGE_KAFKA_HEAP", "320m")
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
        self.nodes[index].child = Some(child);
    }

    async fn wait(&self, index: usize) {
        let node = &self.nodes[index];
        let status = tokio::process::Command::new(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka-wait"),
        )
        .args([
            node.port.to_string(),
            "180".into(),
            node.child.as_ref().expect("started").id().to_string(),
        ])
        .status()
        .await
        .unwrap();
        assert!(
            status.success(),
            "node {} did not start: {}",
            node.id,
            std::fs::read_to_string(
                self.dir
                    .path()
                    .join(format!("node-{}/logs/server.log", node.id))
            )
            .unwrap_or_default()
        );
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
