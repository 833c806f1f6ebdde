//! The Redis ledger's look at `maxmemory-policy`: a policy that may evict
//! posbridge's keys forgets done ids and entity states.

use std::sync::PoisonError;
use std::time::{Duration, Instant};

use redis::Value;

use super::RedisLedger;
use super::connection::{Counted, collect_text};
use crate::adapters::ledger::LedgerError;

/// How often the readiness check reads `maxmemory-policy` again: a policy
/// changed under a running posbridge is seen within this, and readiness
/// probes and status pages in quick succession do not each ask every
/// master for `INFO`.
const POLICY_RECHECK: Duration = Duration::from_secs(5);

impl RedisLedger {
    /// The evicting policy as last seen, looked at again when
    /// [`POLICY_RECHECK`] has passed; a refused `INFO` keeps what was seen.
    pub(super) async fn evicting_now(&self) -> Option<String> {
        let due = {
            let policy = self.policy.lock().unwrap_or_else(PoisonError::into_inner);
            policy.0.elapsed() >= POLICY_RECHECK
        };
        if due {
            let found = Self::evicting_policy(&self.conn).await;
            let mut policy = self.policy.lock().unwrap_or_else(PoisonError::into_inner);
            policy.0 = Instant::now();
            if let Ok(found) = found {
                policy.1 = found;
            }
        }
        self.policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }

    /// The `maxmemory-policy` of a server that may evict our keys, if any
    /// does: every policy but `noeviction` may (the `volatile-*` ones too,
    /// as done ids and leases carry a TTL). Read from `INFO memory`, which
    /// managed services that rename `CONFIG` still answer; on a cluster,
    /// every master's.
    pub(super) async fn evicting_policy(conn: &Counted) -> Result<Option<String>, LedgerError> {
        let info: Value = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn.clone())
            .await?;
        let mut text = String::new();
        collect_text(&info, &mut text);
        Ok(text
            .lines()
            .filter_map(|line| line.trim().strip_prefix("maxmemory_policy:"))
            .find(|policy| *policy != "noeviction")
            .map(str::to_owned))
    }
}
