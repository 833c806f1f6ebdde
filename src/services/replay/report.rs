//! What a run prints on stdout: one JSON line per dead letter read, then one
//! summary line, so a script can follow each record and the whole.

use serde::Serialize;

use crate::services::pipeline::{
    HEADER_DELIVERY_ID, HEADER_PROVIDER, HEADER_SOURCE, Outcome, Redelivery,
};

use super::select::{Letter, Skip};

/// What became of one dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Put through the pipeline again.
    Redelivered(Redelivery),
    /// A dry run: what putting it through would do.
    Planned(Redelivery),
    /// Not put through, and why.
    Skipped(Skip),
}

impl Verdict {
    /// Whether a later run has nothing more to do with the record: false
    /// for one that still fails or whose source is not configured, which a
    /// run after the fix must read again.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            Verdict::Redelivered(Redelivery::StillFailing { .. })
                | Verdict::Planned(Redelivery::StillFailing { .. })
                | Verdict::Skipped(Skip::UnknownSource)
        )
    }

    /// The `outcome` of its line.
    pub fn outcome(&self) -> &'static str {
        match self {
            Verdict::Redelivered(Redelivery::Applied { outcome, .. }) => outcome.as_str(),
            Verdict::Redelivered(Redelivery::StillFailing { .. }) => "still_failing",
            Verdict::Planned(Redelivery::Applied { outcome, .. }) => match outcome {
                Outcome::Stale => "would_be_stale",
                Outcome::Unchanged => "would_be_unchanged",
                _ => "would_publish",
            },
            Verdict::Planned(Redelivery::StillFailing { .. }) => "would_still_fail",
            Verdict::Skipped(_) => "skipped",
        }
    }
}

/// One dead letter's line.
#[derive(Debug, Serialize)]
pub struct Line<'a> {
    /// Where the dead letter is.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its `posbridge-delivery-id` header.
    pub delivery_id: Option<&'a str>,
    /// Its `posbridge-provider` header.
    pub provider: Option<&'a str>,
    /// Its `posbridge-source` header.
    pub source: Option<&'a str>,
    /// `published`, `stale`, `unchanged`, `still_failing`, `skipped`; on a
    /// dry run `would_publish`, `would_be_stale`, `would_be_unchanged`,
    /// `would_still_fail`.
    pub outcome: &'static str,
    /// The entity's record key, when it normalized.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    /// Why it still fails or was skipped, as a code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<&'static str>,
    /// The same in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl<'a> Line<'a> {
    /// The line of `letter`, which came to `verdict`.
    pub fn new(letter: &'a Letter, verdict: &Verdict) -> Line<'a> {
        let (entity, reason_code, reason) = match verdict {
            Verdict::Redelivered(Redelivery::Applied { entity, .. })
            | Verdict::Planned(Redelivery::Applied { entity, .. }) => {
                (Some(entity.as_str().to_owned()), None, None)
            }
            Verdict::Redelivered(Redelivery::StillFailing { code, reason })
            | Verdict::Planned(Redelivery::StillFailing { code, reason }) => {
                (None, Some(*code), Some(reason.clone()))
            }
            Verdict::Skipped(skip) => (None, Some(skip.code()), Some(skip.reason())),
        };
        Line {
            partition: letter.partition,
            offset: letter.offset,
            delivery_id: letter.header(HEADER_DELIVERY_ID),
            provider: letter.header(HEADER_PROVIDER),
            source: letter.header(HEADER_SOURCE),
            outcome: verdict.outcome(),
            entity,
            reason_code,
            reason,
        }
    }
}

/// The counts of a run, its last line (under `summary`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Dead letters read.
    pub records: u64,
    /// Published (on a dry run: would be).
    pub published: u64,
    /// Older than the entity's written state (on a dry run: would be).
    pub stale: u64,
    /// Same content as written (on a dry run: would be).
    pub unchanged: u64,
    /// Still cannot be normalized, encoded or published.
    pub still_failing: u64,
    /// Cut, filtered, reconciled, of an unknown source, or not a dead letter.
    pub skipped: u64,
    /// Whether nothing was written.
    pub dry_run: bool,
    /// `moved`, `kept: filters` or `kept: dry run`.
    pub checkpoints: &'static str,
    /// Whether every selected record reached a final outcome (false: the run
    /// stopped on a failure worth retrying).
    pub complete: bool,
}

impl Summary {
    /// Counts one dead letter's verdict.
    pub fn count(&mut self, verdict: &Verdict) {
        self.records += 1;
        let counter = match verdict {
            Verdict::Redelivered(Redelivery::Applied { outcome, .. })
            | Verdict::Planned(Redelivery::Applied { outcome, .. }) => match outcome {
                Outcome::Published => &mut self.published,
                Outcome::Stale => &mut self.stale,
                _ => &mut self.unchanged,
            },
            Verdict::Redelivered(Redelivery::StillFailing { .. })
            | Verdict::Planned(Redelivery::StillFailing { .. }) => &mut self.still_failing,
            Verdict::Skipped(_) => &mut self.skipped,
        };
        *counter += 1;
    }

    /// The counts in a line, for the progress display.
    pub fn line(&self) -> String {
        format!(
            "published {} · stale {} · unchanged {} · still failing {} · skipped {}",
            self.published, self.stale, self.unchanged, self.still_failing, self.skipped
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::{EntityKey, ProviderKind};

    fn letter() -> Letter {
        Letter {
            partition: 1,
            offset: 9,
            timestamp_ms: Some(0),
            key: Some("receiptroller:d-1".into()),
            body: None,
            headers: [
                (HEADER_DELIVERY_ID, "d-1"),
                (HEADER_PROVIDER, "receiptroller"),
                (HEADER_SOURCE, "main"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        }
    }

    fn json(verdict: &Verdict) -> serde_json::Value {
        serde_json::to_value(Line::new(&letter(), verdict)).unwrap()
    }

    #[test]
    fn each_line_says_where_what_and_why() {
        let entity = EntityKey::new(ProviderKind::ReceiptRoller, None, "T1|2026-11|9");
        assert_eq!(
            json(&Verdict::Redelivered(Redelivery::Applied {
                outcome: Outcome::Published,
                entity: entity.clone(),
            })),
            serde_json::json!({
                "partition": 1, "offset": 9, "delivery_id": "d-1", "provider": "receiptroller",
                "source": "main", "outcome": "published", "entity": "receiptroller:T1|2026-11|9",
            })
        );
        let failing = Redelivery::StillFailing {
            code: "unknown_event_type",
            reason: "unknown event type `sale.exploded`".into(),
        };
        let line = json(&Verdict::Redelivered(failing.clone()));
        assert_eq!(line["outcome"], "still_failing");
        assert_eq!(line["reason_code"], "unknown_event_type");
        assert_eq!(line["reason"], "unknown event type `sale.exploded`");
        assert_eq!(line.get("entity"), None);
        assert_eq!(
            json(&Verdict::Planned(failing))["outcome"],
            "would_still_fail"
        );
        let stale = Verdict::Planned(Redelivery::Applied {
            outcome: Outcome::Stale,
            entity,
        });
        assert_eq!(json(&stale)["outcome"], "would_be_stale");
        let cut = json(&Verdict::Skipped(Skip::Cut));
        assert_eq!(cut["outcome"], "skipped");
        assert_eq!(cut["reason_code"], "cut");
    }

    #[test]
    fn the_summary_counts_each_verdict_once() {
        let mut summary = Summary::default();
        let entity = EntityKey::new(ProviderKind::Mekari, None, "O-1");
        for verdict in [
            Verdict::Redelivered(Redelivery::Applied {
                outcome: Outcome::Published,
                entity: entity.clone(),
            }),
            Verdict::Planned(Redelivery::Applied {
                outcome: Outcome::Unchanged,
                entity,
            }),
            Verdict::Redelivered(Redelivery::StillFailing {
                code: "missing_field",
                reason: "missing field `id`".into(),
            }),
            Verdict::Skipped(Skip::Filtered),
            Verdict::Skipped(Skip::Cut),
        ] {
            summary.count(&verdict);
        }
        assert_eq!(
            (summary.records, summary.published, summary.unchanged),
            (5, 1, 1)
        );
        assert_eq!(
            (summary.still_failing, summary.skipped, summary.stale),
            (1, 2, 0)
        );
    }
}
