//! The floor: the least a durable dedup record costs, as the webhooks
//! bench's dedup limit keeps it (benches/webhooks/limit.rs, a bench binary
//! of its own, so copied here): an in-memory set and an append-only file,
//! group-committed (every write that arrived while the last `fdatasync` ran
//! is appended and synced by the next one). Each line holds the delivery
//! id, the entity slot and its state in hex, so it writes what the ledgers
//! write; opening reads the ids back.

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::mpsc;

/// One insert-if-absent: the line's fields, and where to say whether the id
/// was new once it is durable.
type Insert = (String, String, [u8; 36], tokio::sync::oneshot::Sender<bool>);

/// The floor's writer.
pub struct Floor {
    writer: mpsc::Sender<Insert>,
}

impl Floor {
    /// Opens (or creates) the file in `dir` and starts its writer thread.
    pub fn open(dir: &Path) -> std::io::Result<Floor> {
        let path = dir.join("delivery-ids");
        let mut seen = HashSet::new();
        if let Ok(file) = std::fs::File::open(&path) {
            for line in std::io::BufReader::new(file).lines() {
                if let Some(id) = line?.split('\t').next() {
                    seen.insert(id.to_owned());
                }
            }
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        let (writer, inserts) = mpsc::channel::<Insert>();
        std::thread::spawn(move || {
            let mut batch = Vec::new();
            let mut bytes = Vec::new();
            while let Ok(first) = inserts.recv() {
                batch.push(first);
                batch.extend(inserts.try_iter());
                let fresh: Vec<bool> = batch
                    .iter()
                    .map(|(id, slot, state, _)| {
                        let new = seen.insert(id.clone());
                        if new {
                            let line = format!("{id}\t{slot}\t{}\n", hex::encode(state));
                            bytes.extend_from_slice(line.as_bytes());
                        }
                        new
                    })
                    .collect();
                let synced = bytes.is_empty()
                    || file
                        .write_all(&bytes)
                        .and_then(|()| file.sync_data())
                        .is_ok();
                bytes.clear();
                for ((_, _, _, answer), new) in batch.drain(..).zip(fresh) {
                    let _ = answer.send(new && synced);
                }
            }
        });
        Ok(Floor { writer })
    }

    /// Inserts the id if absent, durably; whether it was new.
    pub async fn insert(&self, id: &str, slot: &str, state: [u8; 36]) -> Result<bool, String> {
        let (answer, new) = tokio::sync::oneshot::channel();
        self.writer
            .send((id.to_owned(), slot.to_owned(), state, answer))
            .map_err(|_| "floor writer gone".to_owned())?;
        new.await.map_err(|_| "floor writer gone".to_owned())
    }
}
