//! The three stores behind one face: a delivery is `begin` (an
//! insert-if-absent lease of its id) then `commit` (the id done with its
//! expiry and one entity state, durable before it returns), as the pipeline
//! does with posbridge's ledger.

use std::path::Path;
use std::time::Duration;

use posbridge::adapters::ledger::{Begin, Commit, Done, EmbeddedLedger, EntitySlot, Held, Store};
use posbridge::domain::event::{DeliveryKey, EntityKey, EntityType, ProviderKind, Version};
use posbridge::domain::guard::EntityState;

use crate::fjall_store::FjallStore;
use crate::floor::Floor;

/// How long done ids are kept, as posbridge's default.
const DEDUP_TTL: Duration = Duration::from_secs(24 * 3600);
/// A lease long enough for any commit here.
const LEASE: Duration = Duration::from_secs(60);
/// How many entity keys the deliveries update, round robin
/// (`POSBRIDGE_LEDGER_BENCH_ENTITIES`, 100 k): a pre-filled store holds them all.
pub fn entity_space() -> u64 {
    static SPACE: std::sync::LazyLock<u64> =
        std::sync::LazyLock::new(|| crate::env("POSBRIDGE_LEDGER_BENCH_ENTITIES", 100_000).max(1));
    *SPACE
}

/// Which store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// posbridge's `EmbeddedLedger`: redb plus its redo log.
    Ours,
    /// The minimal fjall store.
    Fjall,
    /// The append-only file.
    Floor,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Floor, Kind::Ours, Kind::Fjall];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Ours => "redb+redo",
            Kind::Fjall => "fjall",
            Kind::Floor => "floor",
        }
    }

    pub fn parse(name: &str) -> Kind {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .unwrap_or_else(|| panic!("no store named {name}"))
    }
}

/// An open store.
pub enum Engine {
    Ours(EmbeddedLedger),
    Fjall(FjallStore),
    Floor(Floor),
}

/// The delivery key, entity slot and state delivery `n` writes.
pub fn delivery(tag: &str, n: u64) -> (DeliveryKey, EntitySlot, Held) {
    let delivery = DeliveryKey::new(ProviderKind::ReceiptRoller, &format!("{tag}-{n:012}"));
    let entity = EntityKey::new(
        ProviderKind::ReceiptRoller,
        None,
        &format!("T1|2026-12|{:06}", n % entity_space()),
    );
    let mut state_hash = [0u8; 16];
    state_hash[..8].copy_from_slice(&n.to_be_bytes());
    let state = EntityState {
        version: Version {
            at_micros: i64::try_from(n).unwrap_or(i64::MAX),
            rank: 0,
        },
        state_hash,
    };
    let held = Held {
        state,
        offset: i64::try_from(n).ok(),
    };
    (delivery, EntitySlot::new(EntityType::Sale, &entity), held)
}

impl Engine {
    /// Opens (or creates) the store of `kind` in `dir`.
    pub fn open(kind: Kind, dir: &Path) -> Result<Engine, String> {
        Ok(match kind {
            Kind::Ours => Engine::Ours(
                EmbeddedLedger::open(&dir.join("ledger.redb"), DEDUP_TTL, LEASE)
                    .map_err(|e| e.to_string())?,
            ),
            Kind::Fjall => {
                Engine::Fjall(FjallStore::open(dir, DEDUP_TTL).map_err(|e| e.to_string())?)
            }
            Kind::Floor => Engine::Floor(Floor::open(dir).map_err(|e| e.to_string())?),
        })
    }

    /// Opens the store, waiting while a writer that was just let go of
    /// still holds it.
    pub async fn open_when_free(kind: Kind, dir: &Path) -> Engine {
        let mut tries = 0;
        loop {
            match Engine::open(kind, dir) {
                Ok(engine) => return engine,
                Err(e) if tries > 100 => panic!("cannot open {}: {e}", kind.name()),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
            tries += 1;
        }
    }

    /// One new delivery, begin then commit; its id once durable.
    pub async fn deliver(&self, tag: &str, n: u64) -> Result<String, String> {
        let (key, slot, state) = delivery(tag, n);
        let error = |e: posbridge::adapters::ledger::LedgerError| e.to_string();
        match self {
            Engine::Ours(ledger) => {
                let begun = ledger.begin(&key).await.map_err(error)?;
                assert_eq!(begun, Begin::New, "a new delivery id");
                ledger
                    .commit(&Commit::done(Done::published_now(key.clone())).and_state(slot, state))
                    .await
                    .map_err(error)?;
            }
            Engine::Fjall(store) => {
                let begun = store.begin(key.as_str()).map_err(|e| e.to_string())?;
                assert_eq!(begun, Begin::New, "a new delivery id");
                store
                    .commit(key.as_str(), slot.as_str(), state.to_bytes())
                    .await?;
            }
            Engine::Floor(floor) => {
                let new = floor
                    .insert(key.as_str(), slot.as_str(), state.to_bytes())
                    .await?;
                if !new {
                    return Err("the floor's write failed".to_owned());
                }
            }
        }
        Ok(key.as_str().to_owned())
    }

    /// Whether a delivery id (as `deliver` returned it) is done.
    pub async fn is_done(&self, id: &str) -> Result<bool, String> {
        let key = DeliveryKey::from_stored(id.to_owned());
        match self {
            Engine::Ours(ledger) => match ledger.begin(&key).await.map_err(|e| e.to_string())? {
                Begin::Done => Ok(true),
                Begin::New => {
                    ledger.release(&key).await;
                    Ok(false)
                }
                Begin::InFlight => Ok(false),
            },
            Engine::Fjall(store) => store.is_done(id).map_err(|e| e.to_string()),
            Engine::Floor(_) => Err("the floor keeps no lookup".to_owned()),
        }
    }

    /// Lets go of the store (its files stay), waiting for its writer.
    pub async fn close(self, dir: &Path) {
        let kind = match self {
            Engine::Ours(ledger) => {
                drop(ledger);
                Kind::Ours
            }
            Engine::Fjall(store) => {
                store.close();
                return;
            }
            Engine::Floor(_) => return,
        };
        // posbridge's writer thread lets go when its queue closes, after
        // its last durable commit: wait until the file opens again.
        if let Engine::Ours(ledger) = Engine::open_when_free(kind, dir).await {
            drop(ledger);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
