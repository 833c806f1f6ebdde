//! A commit's writes: one script on one server, one key at a time on a
//! cluster (the module documentation says in which order, and why).

use redis::{AsyncCommands, ScriptInvocation};

use super::scripts::{COMMIT, MARK_DONE, SET_STATE};
use super::{RedisLedger, delivery_key};
use crate::adapters::ledger::{Commit, Done, LedgerError};

impl RedisLedger {
    /// [`COMMIT`] for `commit`. An absent part's key is still a key under
    /// the prefix (never written: its argument is empty), so a user whose
    /// ACL allows the prefix's keys alone may run the script.
    fn commit_script(&self, commit: &Commit) -> ScriptInvocation<'static> {
        let mut script = COMMIT.prepare_invoke();
        match &commit.entity {
            Some((slot, held)) => script
                .key(self.key("entity", slot.as_str()))
                .arg(held.to_bytes().as_slice()),
            None => script.key(self.key("entity", "")).arg(""),
        };
        match &commit.checkpoint {
            Some((name, at)) => script.key(self.key("checkpoint", name)).arg(at),
            None => script.key(self.key("checkpoint", "")).arg(""),
        };
        match &commit.delivery {
            Some(done) => script
                .key(self.delivery_key(&done.key, "done"))
                .key(self.delivery_key(&done.key, "lease"))
                .arg(self.dedup_ttl.as_secs().max(1))
                .arg(done.answered.to_bytes())
                .arg(keep(done)),
            None => script
                .key(delivery_key(&self.prefix, "", "done"))
                .key(delivery_key(&self.prefix, "", "lease"))
                .arg("")
                .arg("")
                .arg(""),
        };
        script
    }

    /// A commit's three writes, in the order the module documentation
    /// explains: in one script on one server, one by one on a cluster.
    pub(super) async fn write(&self, commit: &Commit) -> Result<(), LedgerError> {
        let mut conn = self.conn.clone();
        if conn.is_single() {
            let _: i32 = self.commit_script(commit).invoke_async(&mut conn).await?;
            return Ok(());
        }
        if let Some((slot, held)) = &commit.entity {
            let _: i32 = SET_STATE
                .key(self.key("entity", slot.as_str()))
                .arg(held.to_bytes().as_slice())
                .invoke_async(&mut conn)
                .await?;
        }
        if let Some((name, at)) = &commit.checkpoint {
            let () = conn.set(self.key("checkpoint", name), at).await?;
        }
        if let Some(done) = &commit.delivery {
            let _: i32 = MARK_DONE
                .key(self.delivery_key(&done.key, "done"))
                .key(self.delivery_key(&done.key, "lease"))
                .arg(self.dedup_ttl.as_secs().max(1))
                .arg(done.answered.to_bytes())
                .arg(keep(done))
                .invoke_async(&mut conn)
                .await?;
        }
        Ok(())
    }
}

/// The scripts' last argument for `done`: `keep` for an answer read back
/// by a fill, which keeps one already held.
fn keep(done: &Done) -> &'static str {
    if done.read_back { "keep" } else { "" }
}
