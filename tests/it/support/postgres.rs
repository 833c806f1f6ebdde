//! A throwaway PostgreSQL cluster of a test's own (`scripts/postgres`,
//! Debian's server), read and written with psql.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::ports::free_port;
use super::processes::{log_tail, script};
use super::wait::look_for;

/// Why this machine cannot run a throwaway PostgreSQL, if it cannot, in
/// `scripts/postgres --check`'s words (the script knows what it needs).
pub fn missing() -> Option<String> {
    let check = Command::new(script("postgres"))
        .arg("--check")
        .output()
        .expect("scripts/postgres starts");
    (!check.status.success()).then(|| String::from_utf8_lossy(&check.stderr).trim().to_owned())
}

/// A throwaway PostgreSQL cluster (`scripts/postgres`); fast shutdown
/// (SIGINT) on drop.
pub struct Postgres {
    port: u16,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Postgres {
    pub async fn start() -> Postgres {
        // As root the server runs as the OS user `postgres`, which must be
        // able to enter the folder: under /tmp, not the test's target dir.
        let dir = tempfile::Builder::new()
            .prefix("posbridge-sink-pg")
            .tempdir_in("/tmp")
            .unwrap();
        let port = free_port();
        let log = dir.path().join("postgres.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(script("postgres"))
            .arg(port.to_string())
            .arg(dir.path().join("cluster"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("scripts/postgres");
        let mut pg = Postgres {
            port,
            child,
            log,
            _dir: dir,
        };
        let ready = look_for(Duration::from_secs(60), async || {
            if let Some(status) = pg.child.try_wait().unwrap() {
                panic!(
                    "postgres exited ({status}) before answering:\n{}",
                    log_tail(&pg.log)
                );
            }
            pg.try_psql("select 1").ok().map(|_| ())
        })
        .await;
        assert!(
            ready.is_some(),
            "PostgreSQL did not answer within 60 s:\n{}",
            log_tail(&pg.log)
        );
        pg
    }

    /// The libpq connection string psql and compare-sink take.
    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=posbridge",
            self.port
        )
    }

    /// The JDBC URL a connector takes.
    pub fn jdbc(&self) -> String {
        format!("jdbc:postgresql://127.0.0.1:{}/posbridge", self.port)
    }

    fn try_psql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new("psql")
            .args([
                "-X",
                "-q",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                &self.conninfo(),
                "-c",
                sql,
            ])
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// `sql`'s output, unaligned and without headers; the test fails on an error.
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql)
            .unwrap_or_else(|e| panic!("psql {sql}: {e}"))
    }

    /// deploy/connect/tables.sql for the tables `{table_prefix}{plural}`.
    pub fn create_tables(&self, table_prefix: &str) {
        let out = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &self.conninfo()])
            .args([
                "-c",
                &format!("SET posbridge.table_prefix = '{table_prefix}'"),
            ])
            .args(["-c", "SET client_min_messages = warning"])
            .arg("-f")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/connect/tables.sql"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tables.sql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}
