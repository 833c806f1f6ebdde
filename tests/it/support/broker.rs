//! The brokers the tests run on: the shared one `scripts/test` started
//! (Apache Kafka by default, tansu with `POSBRIDGE_TEST_BROKER=tansu`), and a
//! private one of the same kind for a test that kills, freezes or cuts it.

use super::ports::{free_port, free_ports};
use super::processes::script;
use super::proxy::CutProxy;
use std::path::PathBuf;

/// Which broker the suite runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// Apache Kafka 4.x (`scripts/kafka`): the default.
    Kafka,
    /// tansu 0.6 (`scripts/broker`): the broker a user without Java runs.
    Tansu,
}

/// The broker `scripts/test` started (`POSBRIDGE_TEST_BROKER`).
pub fn broker_kind() -> BrokerKind {
    match std::env::var("POSBRIDGE_TEST_BROKER").as_deref() {
        Ok("tansu") => BrokerKind::Tansu,
        _ => BrokerKind::Kafka,
    }
}

/// Fails a test that cannot run on tansu when it runs there anyway, saying
/// `why`. Such tests are named `kafka_only_…` and `scripts/test` skips
/// them on tansu (`--skip kafka_only_`: libtest counts them as filtered
/// out, not as passed), so a green tansu run means what it says; one run
/// there all the same was asked for by name, and is told why it cannot.
pub fn kafka_only(why: &str) {
    assert_ne!(
        broker_kind(),
        BrokerKind::Tansu,
        "an Apache Kafka only test run on tansu: {why}; scripts/test skips kafka_only_ tests there"
    );
}

/// Path of the tansu binary `scripts/test` found.
fn tansu_binary() -> PathBuf {
    std::env::var_os("POSBRIDGE_TEST_TANSU")
        .map(PathBuf::from)
        .expect("POSBRIDGE_TEST_TANSU is set by scripts/test on tansu")
}

/// A private broker behind a TCP proxy the test can cut, as a crashed
/// broker or a network partition looks to posbridge: connections drop and
/// new ones are refused until `heal`. The broker advertises the proxy's
/// address. Killed on drop.
///
/// On Kafka it can also be killed and restarted on its data; tansu 0.6.0
/// cannot be (its SQLite engine panics on the first idempotent produce
/// afterwards), so there `kill` is for good.
pub struct OwnBroker {
    kind: BrokerKind,
    proxy: CutProxy,
    /// Kafka's first port (its PLAINTEXT listener) or tansu's one.
    broker_port: u16,
    dir: tempfile::TempDir,
    child: Option<std::process::Child>,
    /// Kafka's authorizer on (`POSBRIDGE_KAFKA_ACLS=1`).
    acls: bool,
}

impl OwnBroker {
    /// Starts a broker of the suite's kind on free ports.
    pub async fn start() -> OwnBroker {
        Self::start_with(broker_kind(), None, false).await
    }

    /// A Kafka with its authorizer on: the SCRAM users may do only what
    /// ACLs allow; PLAINTEXT clients (the proxy's, the test's) are super
    /// users.
    pub async fn start_with_acls() -> OwnBroker {
        Self::start_with(BrokerKind::Kafka, None, true).await
    }

    /// The same behind a TLS-terminating proxy presenting `acceptor`'s
    /// certificate: clients speak TLS to the advertised address. For tansu,
    /// which has no TLS of its own.
    pub async fn start_tls(acceptor: tokio_native_tls::TlsAcceptor) -> OwnBroker {
        Self::start_with(BrokerKind::Tansu, Some(acceptor), false).await
    }

    async fn start_with(
        kind: BrokerKind,
        tls: Option<tokio_native_tls::TlsAcceptor>,
        acls: bool,
    ) -> OwnBroker {
        let broker_port = match kind {
            BrokerKind::Kafka => free_ports(4),
            BrokerKind::Tansu => free_port(),
        };
        let mut broker = OwnBroker {
            kind,
            proxy: CutProxy::start(broker_port, tls).await,
            broker_port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
            acls,
        };
        broker.run().await;
        broker
    }

    /// Starts the broker process on the broker's folder and waits until it
    /// answers.
    async fn run(&mut self) {
        let advertise = self.proxy.address();
        let child = match self.kind {
            BrokerKind::Kafka => {
                let first = self.broker_port;
                let log = std::fs::File::create(self.dir.path().join("kafka.out")).unwrap();
                std::process::Command::new(script("kafka"))
                    .arg(first.to_string())
                    .arg(self.dir.path().join("kafka"))
                    .arg(format!(
                        "advertised.listeners=PLAINTEXT://{advertise},SSL://127.0.0.1:{},SASL_SSL://127.0.0.1:{}",
                        first + 1,
                        first + 2
                    ))
                    .env("POSBRIDGE_KAFKA_HEAP", "320m")
                    .env("POSBRIDGE_KAFKA_ACLS", if self.acls { "1" } else { "0" })
                    .stdout(log.try_clone().unwrap())
                    .stderr(log)
                    .spawn()
                    .unwrap()
            }
            BrokerKind::Tansu => std::process::Command::new(tansu_binary())
                .current_dir(self.dir.path())
                .args([
                    "broker",
                    "--listener-url",
                    &format!("tcp://127.0.0.1:{}", self.broker_port),
                    "--advertised-listener-url",
                    &format!("tcp://{advertise}"),
                ])
                // Compaction (part of tansu's maintenance) only every
                // hour: the tests on a private broker read back every
                // record they wrote, earlier states of one key included,
                // and a 5 s tick would clean some of them away.
                .args([
                    "--storage-engine",
                    "sqlite://tansu.db?maintenance_interval=1h",
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        };
        let pid = child.id();
        self.child = Some(child);
        let status = tokio::process::Command::new(script("kafka-wait"))
            .args([self.broker_port.to_string(), "120".into(), pid.to_string()])
            .status()
            .await
            .unwrap();
        assert!(
            status.success(),
            "the private {:?} broker did not start: {}",
            self.kind,
            std::fs::read_to_string(self.dir.path().join("kafka/logs/server.log"))
                .unwrap_or_default()
        );
    }

    /// What posbridge connects to.
    pub fn address(&self) -> String {
        self.proxy.address()
    }

    /// A private Kafka's SASL_SSL listener (SCRAM-SHA-512, not proxied) and
    /// the CA that signed its certificate.
    pub fn sasl(&self) -> (String, String) {
        assert_eq!(self.kind, BrokerKind::Kafka, "tansu has no SASL");
        (
            format!("127.0.0.1:{}", self.broker_port + 2),
            self.dir
                .path()
                .join("kafka/tls/ca.pem")
                .display()
                .to_string(),
        )
    }

    /// Points `config` at this broker's SASL_SSL listener as posbridge's
    /// SCRAM user, trusting the broker's CA.
    pub fn as_scram_user(&self, config: &mut posbridge::config::Config) {
        let (sasl, ca_file) = self.sasl();
        config.kafka.brokers = sasl;
        for (key, value) in [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "posbridge"),
            ("sasl.password", "posbridge-scram-secret"),
            ("ssl.ca.location", ca_file.as_str()),
        ] {
            config.kafka.librdkafka.insert(key.into(), value.into());
        }
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.proxy.cut();
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.proxy.heal();
    }

    /// Freezes the broker (SIGSTOP): connections stay open, nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen broker run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// Kills the broker (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed Kafka again on its data, as a restarted broker is.
    pub async fn restart(&mut self) {
        assert_eq!(
            self.kind,
            BrokerKind::Kafka,
            "tansu 0.6 cannot restart on its data"
        );
        self.kill();
        self.run().await;
    }

    /// Replaces the broker by a new, empty one at the same address, as a
    /// re-provisioned cluster looks to posbridge: its data gone, a new
    /// cluster id (Kafka formats a new one), new topic ids.
    pub async fn replace(&mut self) {
        self.kill();
        let data = match self.kind {
            BrokerKind::Kafka => self.dir.path().join("kafka"),
            BrokerKind::Tansu => self.dir.path().join("tansu.db"),
        };
        if data.is_dir() {
            std::fs::remove_dir_all(&data).unwrap();
        } else if data.exists() {
            std::fs::remove_file(&data).unwrap();
        }
        self.run().await;
    }

    fn signal(&self, which: &str) {
        let pid = self.child.as_ref().expect("the broker runs").id();
        let status = std::process::Command::new("kill")
            .args([which, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {which}");
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        // A frozen JVM ignores nothing but SIGKILL; thaw it anyway so that
        // its threads do not linger stopped.
        if let Some(child) = &self.child {
            // Not `signal`: a broker that died by itself must not make the
            // drop panic.
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.kill();
    }
}

/// The shared Kafka's TLS listeners and SCRAM user, as `scripts/test` names
/// them (`scripts/kafka` makes the CA and the credentials); `None` on tansu.
pub struct KafkaSecurity {
    /// The SSL listener.
    pub ssl: String,
    /// The SASL_SSL listener (SCRAM-SHA-512).
    pub sasl: String,
    /// The CA that signed the broker's certificate.
    pub ca_file: String,
    /// posbridge's SCRAM user.
    pub user: &'static str,
    /// Its password.
    pub password: &'static str,
}

/// See [`KafkaSecurity`].
pub fn kafka_security() -> Option<KafkaSecurity> {
    let var = |name: &str| std::env::var(name).ok();
    Some(KafkaSecurity {
        ssl: var("POSBRIDGE_TEST_KAFKA_SSL")?,
        sasl: var("POSBRIDGE_TEST_KAFKA_SASL")?,
        ca_file: var("POSBRIDGE_TEST_KAFKA_CA")?,
        user: "posbridge",
        password: "posbridge-scram-secret",
    })
}
