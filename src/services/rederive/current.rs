//! Which record of a key a run derives again: the one whose state the
//! ledger holds, told apart by its offset.

use crate::adapters::ledger::Held;
use crate::domain::guard::EntityState;

/// Whether the record at `offset` that wrote `state` is its key's state
/// now, by what the ledger holds of the key: that state written by that
/// record (a state with no offset known, by any record: one stored before
/// offsets were kept), or that state's version in doubt. A record derived
/// again in another's place may carry the very state of the one it
/// replaced (a fix to a field the hash leaves out), so the offset tells the
/// replaced record, which the next run passes over, from its replacement.
/// A version in doubt is what a run cut while this record's replacement was
/// on the wire leaves (a broker outage): whether or not the replacement
/// landed, nothing newer did, and the run that resumes derives this record
/// again, so the key ends with the fixed value either way.
pub(super) fn is_current(held: &Held, state: &EntityState, offset: i64) -> bool {
    held.state == state.in_doubt()
        || (held.state == *state && held.offset.is_none_or(|at| at == offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Version;

    fn state(hash: u8) -> EntityState {
        EntityState {
            version: Version {
                at_micros: 100,
                rank: 0,
            },
            state_hash: [hash; 16],
        }
    }

    /// A fix to a field the hash leaves out: the replaced record (offset 3)
    /// and its replacement (offset 9) carry one state; only the one the
    /// ledger's offset names is derived again.
    #[test]
    fn of_two_records_of_one_state_only_the_one_that_wrote_it_is_current() {
        let held = Held {
            state: state(1),
            offset: Some(9),
        };
        assert!(is_current(&held, &state(1), 9));
        assert!(!is_current(&held, &state(1), 3), "the replaced one");
        assert!(!is_current(&held, &state(2), 9), "another state");
    }

    #[test]
    fn a_state_stored_without_its_offset_is_any_of_its_records() {
        let held = Held::unplaced(state(1));
        assert!(is_current(&held, &state(1), 3));
        assert!(is_current(&held, &state(1), 9));
    }

    /// A run cut while a replacement was on the wire leaves its version in
    /// doubt: the record it was to replace is derived again by the next.
    #[test]
    fn a_records_version_in_doubt_is_current() {
        let held = Held::unplaced(state(1).in_doubt());
        assert!(is_current(&held, &state(1), 3));
        assert!(is_current(&held, &state(7), 3), "whatever its hash");
        let newer = Held::unplaced(
            EntityState {
                version: Version {
                    at_micros: 101,
                    rank: 0,
                },
                state_hash: [1; 16],
            }
            .in_doubt(),
        );
        assert!(
            !is_current(&newer, &state(1), 3),
            "a newer version in doubt"
        );
    }
}
