//! Which dead letters a run puts through again, decided from the record
//! alone: its headers, its timestamp and the run's filters. No I/O, so
//! every rule is tested here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio::time::Instant;

use bytes::Bytes;
use time::OffsetDateTime;

use crate::domain::event::{ProviderKind, Source};
use crate::domain::verify::VerifiedBody;
use crate::observe::traces::DeliveryTrace;
use crate::services::pipeline::{
    Delivery, HEADER_BODY_BYTES, HEADER_DELIVERY_ID, HEADER_PROVIDER, HEADER_REASON,
    HEADER_REASON_CODE, HEADER_SOURCE,
};
use crate::services::reconcile::RECONCILED_ID_PREFIX;

/// One record of the dead-letter topic, owned.
#[derive(Debug, Clone)]
pub struct Letter {
    /// Its partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// Its timestamp (the delivery's arrival), milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
    /// Its key: a dead letter's delivery (`{provider}:{delivery id}`), an
    /// entity record's entity.
    pub key: Option<String>,
    /// The raw body; a dead letter always has one.
    pub body: Option<Bytes>,
    /// Its headers, as UTF-8.
    pub headers: BTreeMap<String, String>,
}

impl Letter {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// When the delivery arrived: the record's timestamp.
    fn received_at(&self) -> Option<OffsetDateTime> {
        let nanos = i128::from(self.timestamp_ms?) * 1_000_000;
        OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
    }
}

/// Which dead letters a run takes; every part left out takes all.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this provider's.
    pub provider: Option<ProviderKind>,
    /// Only those that came through this source.
    pub source: Option<String>,
    /// Only those that arrived at or after this time.
    pub since: Option<OffsetDateTime>,
    /// Only those that arrived before this time.
    pub until: Option<OffsetDateTime>,
    /// Only those with this reason code (`posbridge-reason-code`). Dead
    /// letters written before the header existed have none and do not match.
    pub reason: Option<String>,
}

impl Filter {
    /// Whether it takes every dead letter: only such a run moves checkpoints.
    pub fn is_empty(&self) -> bool {
        let Filter {
            provider,
            source,
            since,
            until,
            reason,
        } = self;
        provider.is_none()
            && source.is_none()
            && since.is_none()
            && until.is_none()
            && reason.is_none()
    }

    fn matches(&self, provider: ProviderKind, letter: &Letter, at: OffsetDateTime) -> bool {
        self.provider.is_none_or(|p| p == provider)
            && self
                .source
                .as_deref()
                .is_none_or(|s| letter.header(HEADER_SOURCE) == Some(s))
            && self.since.is_none_or(|since| at >= since)
            && self.until.is_none_or(|until| at < until)
            && self
                .reason
                .as_deref()
                .is_none_or(|code| letter.header(HEADER_REASON_CODE) == Some(code))
    }
}

/// Why a dead letter is not put through again. Each is final: a later run
/// without filters would decide the same (filtered ones aside, which is why
/// a filtered run moves no checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Not a dead letter posbridge wrote: a header or part it always
    /// carries is missing or unreadable.
    Malformed(&'static str),
    /// Outside the run's filters.
    Filtered,
    /// Only the body's head is kept (the whole was too large for Kafka).
    Cut,
    /// A record read from a provider's API, not a webhook: the next
    /// reconcile of its window reads it again.
    Reconciled,
    /// Its source is not in the configuration (any more).
    UnknownSource,
}

impl Skip {
    /// The `reason_code` of its report line.
    pub fn code(self) -> &'static str {
        match self {
            Skip::Malformed(_) => "malformed",
            Skip::Filtered => "filtered",
            Skip::Cut => "cut",
            Skip::Reconciled => "reconciled",
            Skip::UnknownSource => "unknown_source",
        }
    }

    /// The `reason` of its report line.
    pub fn reason(self) -> String {
        match self {
            Skip::Malformed(what) => format!("not a posbridge dead letter: {what}"),
            Skip::Filtered => "outside the filters of this run".into(),
            Skip::Cut => "only the body's head was kept; the whole body is not on the topic".into(),
            Skip::Reconciled => {
                "a record read from the provider's API; the next reconcile of its window reads it again".into()
            }
            Skip::UnknownSource => "its source is not in the configuration".into(),
        }
    }
}

/// What to do with one dead letter.
#[derive(Debug)]
pub enum Selection {
    /// Put it through the pipeline again as this delivery.
    Redeliver(Delivery),
    /// Report it and go on.
    Skip(Skip),
}

/// The configured sources by provider and name: a dead letter names its
/// source, and the source brings its merchant account.
pub type Sources = HashMap<(ProviderKind, String), Arc<Source>>;

/// Decides what to do with `letter`: skipped, or redelivered as the
/// delivery it was (same provider, source, delivery id and arrival time).
pub fn select(letter: &Letter, filter: &Filter, sources: &Sources) -> Selection {
    let skip = Selection::Skip;
    let Some(delivery_id) = letter.header(HEADER_DELIVERY_ID) else {
        return skip(Skip::Malformed("no delivery id header"));
    };
    let Some(provider) = letter.header(HEADER_PROVIDER).and_then(ProviderKind::parse) else {
        return skip(Skip::Malformed("no known provider header"));
    };
    let Some(source) = letter.header(HEADER_SOURCE) else {
        return skip(Skip::Malformed("no source header"));
    };
    if letter.header(HEADER_REASON).is_none() {
        return skip(Skip::Malformed("no reason header"));
    }
    let Some(received_at) = letter.received_at() else {
        return skip(Skip::Malformed("no timestamp"));
    };
    let Some(body) = &letter.body else {
        return skip(Skip::Malformed("no body"));
    };
    if !filter.matches(provider, letter, received_at) {
        return skip(Skip::Filtered);
    }
    if letter.header(HEADER_BODY_BYTES).is_some() {
        return skip(Skip::Cut);
    }
    if delivery_id.starts_with(RECONCILED_ID_PREFIX) {
        return skip(Skip::Reconciled);
    }
    let Some(source) = sources.get(&(provider, source.to_owned())) else {
        return skip(Skip::UnknownSource);
    };
    Selection::Redeliver(Delivery {
        source: source.clone(),
        delivery_id: delivery_id.into(),
        body: VerifiedBody::from_dead_letter(body.clone()),
        received_at,
        arrived: Instant::now(),
        spools: false,
        // The pipeline starts the span of its replay.
        trace: DeliveryTrace::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn sources() -> Sources {
        [
            (ProviderKind::Mekari, "acme", Some("acme")),
            (ProviderKind::ReceiptRoller, "main", None),
        ]
        .into_iter()
        .map(|(provider, name, account)| {
            let source = Source {
                provider,
                name: name.into(),
                account: account.map(str::to_owned),
                topic_prefix: None,
            };
            ((provider, name.to_owned()), Arc::new(source))
        })
        .collect()
    }

    /// A dead letter as posbridge writes it: Mekari, source `acme`, 10:00 UTC.
    fn letter() -> Letter {
        Letter {
            partition: 2,
            offset: 41,
            timestamp_ms: Some(datetime!(2026-11-29 10:00 UTC).unix_timestamp() * 1000 + 250),
            key: Some("mekari:e-1".into()),
            body: Some(Bytes::from_static(br#"{"id":"e-1"}"#)),
            headers: [
                (HEADER_DELIVERY_ID, "e-1"),
                (HEADER_PROVIDER, "mekari"),
                (HEADER_SOURCE, "acme"),
                (HEADER_REASON, "field `data.total` is not a number"),
                (HEADER_REASON_CODE, "invalid_field"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        }
    }

    fn skipped(letter: &Letter, filter: &Filter) -> Option<Skip> {
        match select(letter, filter, &sources()) {
            Selection::Skip(skip) => Some(skip),
            Selection::Redeliver(_) => None,
        }
    }

    #[test]
    fn a_dead_letter_is_redelivered_as_the_delivery_it_was() {
        let Selection::Redeliver(delivery) = select(&letter(), &Filter::default(), &sources())
        else {
            panic!("redelivered");
        };
        assert_eq!(delivery.delivery_id, "e-1");
        assert_eq!(delivery.source.provider, ProviderKind::Mekari);
        assert_eq!(
            delivery.source.account.as_deref(),
            Some("acme"),
            "the source's account"
        );
        assert_eq!(delivery.received_at, datetime!(2026-11-29 10:00:00.25 UTC));
        assert_eq!(&delivery.body.bytes()[..], br#"{"id":"e-1"}"#);
        assert!(!delivery.spools);
    }

    #[test]
    fn each_filter_selects_by_its_own_header() {
        let letter = letter();
        let all = Filter::default();
        assert!(all.is_empty());
        let cases = [
            (
                Filter {
                    provider: Some(ProviderKind::Mekari),
                    ..all.clone()
                },
                None,
            ),
            (
                Filter {
                    provider: Some(ProviderKind::ReceiptRoller),
                    ..all.clone()
                },
                Some(Skip::Filtered),
            ),
            (
                Filter {
                    source: Some("acme".into()),
                    ..all.clone()
                },
                None,
            ),
            (
                Filter {
                    source: Some("main".into()),
                    ..all.clone()
                },
                Some(Skip::Filtered),
            ),
            (
                Filter {
                    reason: Some("invalid_field".into()),
                    ..all.clone()
                },
                None,
            ),
            (
                Filter {
                    reason: Some("publish_refused".into()),
                    ..all.clone()
                },
                Some(Skip::Filtered),
            ),
            // --since is inclusive, --until exclusive, to the millisecond.
            (
                Filter {
                    since: Some(datetime!(2026-11-29 10:00:00.25 UTC)),
                    ..all.clone()
                },
                None,
            ),
            (
                Filter {
                    since: Some(datetime!(2026-11-29 10:00:00.251 UTC)),
                    ..all.clone()
                },
                Some(Skip::Filtered),
            ),
            (
                Filter {
                    until: Some(datetime!(2026-11-29 10:00:00.251 UTC)),
                    ..all.clone()
                },
                None,
            ),
            (
                Filter {
                    until: Some(datetime!(2026-11-29 10:00:00.25 UTC)),
                    ..all.clone()
                },
                Some(Skip::Filtered),
            ),
        ];
        for (filter, expected) in cases {
            assert!(!filter.is_empty());
            assert_eq!(skipped(&letter, &filter), expected, "{filter:?}");
        }
    }

    #[test]
    fn a_dead_letter_without_a_reason_code_matches_no_reason_filter() {
        let mut old = letter();
        old.headers.remove(HEADER_REASON_CODE);
        assert_eq!(
            skipped(&old, &Filter::default()),
            None,
            "replayed without a filter"
        );
        let by_reason = Filter {
            reason: Some("invalid_field".into()),
            ..Filter::default()
        };
        assert_eq!(skipped(&old, &by_reason), Some(Skip::Filtered));
    }

    #[test]
    fn cut_reconciled_and_unknown_source_dead_letters_are_skipped() {
        let mut cut = letter();
        cut.headers
            .insert(HEADER_BODY_BYTES.into(), "3000000".into());
        assert_eq!(skipped(&cut, &Filter::default()), Some(Skip::Cut));

        let mut reconciled = letter();
        reconciled.headers.insert(
            HEADER_DELIVERY_ID.into(),
            "reconcile:1795946400000000".into(),
        );
        assert_eq!(
            skipped(&reconciled, &Filter::default()),
            Some(Skip::Reconciled)
        );

        let mut gone = letter();
        gone.headers
            .insert(HEADER_SOURCE.into(), "closed-shop".into());
        assert_eq!(
            skipped(&gone, &Filter::default()),
            Some(Skip::UnknownSource)
        );

        // A filter is decided first: a filtered run says why it passed over each.
        let other = Filter {
            provider: Some(ProviderKind::ReceiptRoller),
            ..Filter::default()
        };
        assert_eq!(skipped(&cut, &other), Some(Skip::Filtered));
    }

    #[test]
    fn a_record_posbridge_did_not_write_is_malformed() {
        for header in [
            HEADER_DELIVERY_ID,
            HEADER_PROVIDER,
            HEADER_SOURCE,
            HEADER_REASON,
        ] {
            let mut foreign = letter();
            foreign.headers.remove(header);
            assert!(
                matches!(
                    skipped(&foreign, &Filter::default()),
                    Some(Skip::Malformed(_))
                ),
                "{header}"
            );
        }
        let mut unknown_provider = letter();
        unknown_provider
            .headers
            .insert(HEADER_PROVIDER.into(), "square".into());
        let mut no_body = letter();
        no_body.body = None;
        let mut no_time = letter();
        no_time.timestamp_ms = None;
        for foreign in [unknown_provider, no_body, no_time] {
            let skip = skipped(&foreign, &Filter::default());
            assert!(matches!(skip, Some(Skip::Malformed(_))), "{foreign:?}");
            assert_eq!(skip.map(Skip::code), Some("malformed"));
        }
    }
}
