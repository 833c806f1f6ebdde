//! What a delivery, a fill or a service makes durable in the ledger: one
//! [`Commit`], made only by the constructor named for its outcome.

use super::{Done, EntitySlot, Held, Placed};
use crate::domain::guard::EntityState;

/// One durable outcome: a delivery marked done and/or an entity's new state.
///
/// Made only by its constructors, each named for the outcome it records;
/// its fields are the ledger's. So a commit that says where its record
/// lies ([`Placed`], what a checkpoint counts its offsets by) is made only
/// from the placement of a send ([`Commit::published`],
/// [`Commit::dead_lettered`]), and the entity state a publish records
/// lies at that record's offset.
#[derive(Debug, Clone)]
pub struct Commit {
    /// The delivery that is now done, with what it was answered (none for
    /// reconciled records).
    pub(super) delivery: Option<Done>,
    /// The entity state that is now in the topic, with its record's offset
    /// where known (none for dead letters and stale events).
    pub(super) entity: Option<(EntitySlot, Held)>,
    /// A reconciler checkpoint that moved: its name and the unix second up
    /// to which its window is complete.
    pub(super) checkpoint: Option<(String, i64)>,
    /// Where the record of this outcome lies (none when nothing was
    /// written), so a checkpoint knows how far the topics are applied.
    pub(super) placed: Option<Placed>,
}

impl Commit {
    pub(super) const NOTHING: Commit = Commit {
        delivery: None,
        entity: None,
        checkpoint: None,
        placed: None,
    };

    /// A record published: the entity's state at the record's offset, and
    /// the delivery that wrote it when it held a lease (a reconciled record
    /// has none).
    pub fn published(
        delivery: Option<Done>,
        slot: EntitySlot,
        state: EntityState,
        placed: Placed,
    ) -> Commit {
        Commit {
            delivery,
            entity: Some((
                slot,
                Held {
                    state,
                    offset: Some(placed.at.offset),
                },
            )),
            checkpoint: None,
            placed: Some(placed),
        }
    }

    /// A dead letter published, and the delivery it ends.
    pub fn dead_lettered(delivery: Option<Done>, placed: Placed) -> Commit {
        Commit {
            delivery,
            placed: Some(placed),
            ..Commit::NOTHING
        }
    }

    /// A delivery done with no record of its own (stale, unchanged, a
    /// dead letter whose record is another's), or a done id a fill read
    /// back.
    pub fn done(done: Done) -> Commit {
        Commit::NOTHING.and_done(done)
    }

    /// An entity's state as held: read back by a fill (at its record's
    /// offset), or of a record in doubt (no offset known).
    pub fn state(slot: EntitySlot, held: Held) -> Commit {
        Commit::NOTHING.and_state(slot, held)
    }

    /// A checkpoint that moved: `name` complete up to the unix second `at`.
    pub fn checkpoint(name: impl Into<String>, at: i64) -> Commit {
        Commit::NOTHING.and_checkpoint(name, at)
    }

    /// This commit with a delivery done too.
    #[must_use]
    pub fn and_done(self, done: Done) -> Commit {
        Commit {
            delivery: Some(done),
            ..self
        }
    }

    /// This commit with an entity's state too (as [`Commit::state`]).
    #[must_use]
    pub fn and_state(self, slot: EntitySlot, held: Held) -> Commit {
        Commit {
            entity: Some((slot, held)),
            ..self
        }
    }

    /// This commit with a checkpoint moved too.
    #[must_use]
    pub fn and_checkpoint(self, name: impl Into<String>, at: i64) -> Commit {
        Commit {
            checkpoint: Some((name.into(), at)),
            ..self
        }
    }

    /// The delivery it marks done, if any.
    pub fn delivery(&self) -> Option<&Done> {
        self.delivery.as_ref()
    }

    /// The entity state it records, if any.
    pub fn entity(&self) -> Option<&(EntitySlot, Held)> {
        self.entity.as_ref()
    }
}
