//! `scale`: posbridge on ledgers filled with millions of delivery ids and
//! entities, beside the same backend's empty ledger and the limit.

use crate::limit;
use crate::report::{self, Phase};
use crate::{LedgerChoice, Settings, Spec, Under, bench, fill};

/// Fills an embedded and (with `POSBRIDGE_BENCH_REDIS`) a Redis ledger,
/// then runs posbridge on empty and filled ledgers beside the limit.
pub(crate) async fn run(settings: &Settings, run: &str) {
    let work = tempfile::tempdir().expect("work dir");
    let size = fill::Size::from_env();
    let filled = fill::embedded(&work.path().join("filled.redb"), size).await;
    let mut specs = vec![
        Spec {
            name: report::LIMIT,
            under: Under::Limit(limit::LimitKind::Produce),
            phases: vec![Phase::Closed(64), Phase::Closed(256)],
        },
        posbridge_spec(report::POSBRIDGE, LedgerChoice::Embedded(None)),
        posbridge_spec("posbridge, filled", LedgerChoice::Embedded(Some(filled))),
    ];
    if let Some(url) = &settings.redis {
        let prefix = format!("{run}.filled:");
        fill::redis(url, &prefix, size).await;
        specs.push(posbridge_spec(
            "posbridge, redis",
            LedgerChoice::Redis {
                url: url.clone(),
                prefix: None,
            },
        ));
        specs.push(posbridge_spec(
            "posbridge, redis filled",
            LedgerChoice::Redis {
                url: url.clone(),
                prefix: Some(prefix),
            },
        ));
    }
    let rows = bench(settings, run, &specs).await;
    report::scale(&rows);
}

fn posbridge_spec(name: &'static str, ledger: LedgerChoice) -> Spec {
    Spec {
        name,
        under: Under::Posbridge(ledger),
        phases: vec![Phase::Closed(64), Phase::Closed(256), Phase::Duplicates],
    }
}
