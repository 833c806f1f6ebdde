//! Where records go: the shared topics (`kafka.topic_prefix`, `kafka.topics`,
//! `kafka.dead_letter_topic`), and the topics of each source with a
//! `topic_prefix` of its own.
//!
//! The sets in use only grow while posbridge runs: a source's set is opened
//! (made, checked, its subjects registered: `app::topics`) before the
//! source takes a delivery, and stays when the source goes, so what it
//! spooled still drains there and the ledger's fill still reads it.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::KafkaConfig;
use crate::config::{dead_letter_of, entity_topic};
use crate::domain::event::EntityType;

/// Topic names by entity type, plus the dead-letter topic: one set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    /// Its source's own prefix; none for the shared topics.
    prefix: Option<String>,
    /// One compacted topic per entity type.
    entities: BTreeMap<EntityType, Arc<str>>,
    /// Raw bodies that could not be normalized.
    dead_letter: Arc<str>,
}

impl Topics {
    /// The shared topics the configuration names (defaults from the prefix).
    pub fn new(config: &KafkaConfig) -> Topics {
        Topics {
            prefix: None,
            entities: EntityType::ALL
                .into_iter()
                .map(|t| (t, config.topic(t).into()))
                .collect(),
            dead_letter: config.dead_letter_topic().into(),
        }
    }

    /// A source's own topics under `prefix`: `{prefix}{plural}`, and its
    /// dead-letter topic named as the shared one is by default.
    pub fn prefixed(prefix: &str) -> Topics {
        Topics {
            prefix: Some(prefix.to_owned()),
            entities: EntityType::ALL
                .into_iter()
                .map(|t| (t, entity_topic(prefix, t).into()))
                .collect(),
            dead_letter: dead_letter_of(prefix).into(),
        }
    }

    /// The prefix of a source's own topics; none for the shared ones.
    pub fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// The compacted topic of an entity type, shared: a record names it
    /// without a copy.
    pub fn entity(&self, entity_type: EntityType) -> &Arc<str> {
        // Built from EntityType::ALL; a missing entry is a bug.
        &self.entities[&entity_type]
    }

    /// Every entity topic.
    pub fn entities(&self) -> impl Iterator<Item = &str> {
        self.entities.values().map(AsRef::as_ref)
    }

    /// The dead-letter topic.
    pub fn dead_letter(&self) -> &Arc<str> {
        &self.dead_letter
    }

    /// Every topic with whether it is compacted: entity topics are, the
    /// dead-letter topic (raw bodies, each its own record) is not.
    pub fn all(&self) -> BTreeMap<String, bool> {
        let mut all: BTreeMap<String, bool> =
            self.entities().map(|t| (t.to_owned(), true)).collect();
        all.insert(self.dead_letter.to_string(), false);
        all
    }

    /// Every topic with its entity type (none: the dead-letter topic).
    pub fn typed(&self) -> impl Iterator<Item = (&str, Option<EntityType>)> {
        self.entities
            .iter()
            .map(|(t, name)| (name.as_ref(), Some(*t)))
            .chain([(self.dead_letter.as_ref(), None)])
    }
}

/// The shared set and every source's own set opened so far, shared by the
/// pipeline, the ledger's rebuild and the topic watch. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TopicSets {
    shared: Arc<Topics>,
    /// Each opened prefix's set.
    own: Arc<ArcSwap<BTreeMap<String, Arc<Topics>>>>,
}

impl TopicSets {
    /// The shared set alone.
    pub fn new(config: &KafkaConfig) -> TopicSets {
        TopicSets {
            shared: Arc::new(Topics::new(config)),
            own: Arc::default(),
        }
    }

    /// The shared topics.
    pub fn shared(&self) -> &Topics {
        &self.shared
    }

    /// Where a source's records go: its own set when it has a prefix (named
    /// as opened, or from the prefix itself when not opened yet), else the
    /// shared one.
    pub fn of(&self, prefix: Option<&str>) -> Arc<Topics> {
        match prefix {
            None => self.shared.clone(),
            Some(prefix) => self
                .own
                .load()
                .get(prefix)
                .cloned()
                .unwrap_or_else(|| Arc::new(Topics::prefixed(prefix))),
        }
    }

    /// Whether `prefix`'s set is open.
    pub fn is_open(&self, prefix: &str) -> bool {
        self.own.load().contains_key(prefix)
    }

    /// Puts `prefix`'s set in use, once its topics are ready.
    pub fn open(&self, prefix: &str) {
        self.own.rcu(|sets| {
            let mut sets = BTreeMap::clone(sets);
            sets.entry(prefix.to_owned())
                .or_insert_with(|| Arc::new(Topics::prefixed(prefix)));
            sets
        });
    }

    /// Every set in use: the shared one first.
    pub fn all(&self) -> Vec<Arc<Topics>> {
        std::iter::once(self.shared.clone())
            .chain(self.own.load().values().cloned())
            .collect()
    }

    /// Every entity topic of every set in use.
    pub fn entity_topics(&self) -> Vec<String> {
        self.all()
            .iter()
            .flat_map(|set| set.entities().map(str::to_owned).collect::<Vec<_>>())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_names_its_own_topics_and_stays_open() {
        let sets = TopicSets::new(&KafkaConfig::default());
        assert_eq!(&**sets.of(None).entity(EntityType::Sale), "pos.sales");
        let acme = sets.of(Some("acme."));
        assert_eq!(&**acme.entity(EntityType::Sale), "acme.sales");
        assert_eq!(&**acme.dead_letter(), "acme-dead-letter");
        assert!(!sets.is_open("acme."));
        sets.open("acme.");
        sets.open("acme.");
        assert!(sets.is_open("acme."));
        assert_eq!(sets.all().len(), 2);
        assert_eq!(
            sets.entity_topics().len(),
            2 * EntityType::ALL.len(),
            "the shared entity topics and acme's"
        );
    }
}
