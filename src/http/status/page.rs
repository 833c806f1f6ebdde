//! The operator's page, rendered on the server from a [`Status`]: one HTML
//! document with its style and charts inline (no scripts, no external
//! assets, nothing to build), refreshed by the browser every 10 s. Its
//! markup is a maud template: every value spliced in (delivery ids, event
//! types, keys, a provider's detail) is escaped by the template itself.

use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde::Serialize;
use time::OffsetDateTime;
use time::macros::format_description;

use super::chart;
use crate::adapters::spool::SpoolStats;
use crate::observe::board::SourceSnapshot;

/// How the page groups answers, in its column order: outcome keys of 2xx
/// answers, then refusals by status.
pub const COLUMNS: [(&str, &str); 11] = [
    ("published", "published"),
    ("duplicate", "duplicate"),
    ("stale", "stale"),
    ("unchanged", "unchanged"),
    ("dead_lettered", "dead-lettered"),
    ("spooled", "spooled"),
    ("401", "refused 401"),
    ("400", "refused 400"),
    ("408", "refused 408"),
    ("413", "refused 413"),
    ("503", "503"),
];

/// The whole page's data; `/status.json` is this.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// When it was put together.
    #[serde(with = "time::serde::rfc3339")]
    pub generated_at: OffsetDateTime,
    /// Broker, ledger, registry and spool, as `/readyz` sees them.
    pub health: Health,
    /// The sources on this page (those matching the search).
    pub sources: Vec<SourceSnapshot>,
    /// The search and the page shown.
    pub shown: Shown,
    /// The sources directory's files refused now (their sources keep
    /// their last good settings, or are absent).
    pub refused_source_files: Vec<super::RefusedFile>,
}

/// Which sources a page shows: a search and a page of its matches, so the
/// page stays usable with a thousand sources.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Shown {
    /// What the provider or source name must hold (empty: every source).
    pub query: String,
    /// The page shown, from 0.
    pub page: usize,
    /// Sources a page holds.
    pub per_page: usize,
    /// Sources that match, on every page.
    pub matched: usize,
    /// Sources in all.
    pub total: usize,
}

impl Shown {
    /// The pages the matches fill.
    fn pages(&self) -> usize {
        self.matched.div_ceil(self.per_page.max(1)).max(1)
    }

    /// The link to page `page` of the same search.
    fn link(&self, page: usize) -> String {
        let query: String = url::form_urlencoded::byte_serialize(self.query.as_bytes()).collect();
        format!("?q={query}&page={page}")
    }
}

/// The shared parts' state.
#[derive(Debug, Clone, Serialize)]
pub struct Health {
    /// `ok` or `unavailable`.
    pub broker: &'static str,
    /// `ok` or the ledger's error.
    pub ledger: String,
    /// Where the ledger's last (or running) fill from the topics stands.
    pub ledger_rebuild: Option<crate::adapters::ledger::Progress>,
    /// `ok`, `unavailable`, or `not used`.
    pub schema_registry: &'static str,
    /// The spool's entries and bytes, when a source spools.
    pub spool: Option<SpoolStats>,
    /// The spool's deepest depth per minute, the last hour, oldest first
    /// (empty when no source spools).
    pub spool_depth_per_minute: Vec<u64>,
    /// Dead letters written since start.
    pub dead_letters_since_start: u64,
    /// Topics Kafka refuses while the cluster answers, with the reason.
    pub failing_topics: std::collections::BTreeMap<String, String>,
}

/// The page's style, inline (no external assets).
const STYLE: &str = concat!(
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}",
    "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}",
    "table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .6em;border:1px solid #ddd;text-align:left}",
    "th{background:#f4f4f4}td.n{text-align:right}.ok{color:#176f2c}.bad{color:#b00020;font-weight:bold}",
    ".charts .chart{display:inline-block;vertical-align:top;margin:0 1em .5em 0;max-width:542px}.charts svg{border:1px solid #ddd;background:#fcfcfc}",
    ".legend{margin:.2em 0}",
    ".legend span{margin-right:1em;white-space:nowrap}.legend i{display:inline-block;width:.8em;height:.8em;margin-right:.3em;vertical-align:-.05em}",
);

/// A page's head: its title, the inline style, and with `refresh` a
/// reload every 10 s.
pub(super) fn head(title: Markup, refresh: bool) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            @if refresh {
                meta http-equiv="refresh" content="10";
            }
            title { (title) }
            style { (PreEscaped(STYLE)) }
        }
    }
}

/// The HTML page. maud escapes every value it splices in, so a
/// provider-sent string never becomes markup; only the charts' SVG, which
/// holds numbers and our own words, goes in as it is.
pub fn render(status: &Status) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(html! { "posbridge status" }, true))
            body {
                h1 { "posbridge" }
                p { "As of " (time_text(status.generated_at)) " (refreshes every 10 s)." }
                (health(&status.health))
                @if !status.refused_source_files.is_empty() {
                    table #refused-source-files {
                        tr { th { "source file refused" } th { "why (its source keeps its last good settings, if it had any)" } }
                        @for refused in &status.refused_source_files {
                            tr { td.bad { (refused.path.display()) } td { (refused.reason) } }
                        }
                    }
                }
                (super::lookup::form("", super::lookup::Page::Status))
                (search(&status.shown))
                @for source in &status.sources {
                    (source_section(source))
                }
            }
        }
    }
    .into_string()
}

fn health(health: &Health) -> Markup {
    html! {
        table #health {
            tr {
                th { "broker" } th { "ledger" } th { "schema registry" } th { "spool" }
                th { "dead letters since start" }
            }
            tr {
                td { (state_cell(health.broker)) }
                td { (state_cell(&health.ledger)) }
                td { (state_cell(health.schema_registry)) }
                td {
                    @match health.spool {
                        None => "not used",
                        Some(spool) => {
                            (spool.entries) " waiting, " (spool.bytes) " bytes"
                            @match (spool.writable, spool.has_room) {
                                (false, _) => { ", " span.bad { "cannot write" } }
                                (true, false) => { ", " span.bad { "full" } }
                                (true, true) => {}
                            }
                            @if spool.quarantined > 0 {
                                ", " span.bad { (spool.quarantined) " damaged in quarantine" }
                            }
                        }
                    }
                }
                td.n { (health.dead_letters_since_start) }
            }
        }
        @if health.spool.is_some() {
            div.charts { (svg(|html| chart::spool(html, &health.spool_depth_per_minute))) }
        }
        @if let Some(why) = health.ledger_rebuild.as_ref().and_then(|r| r.forgotten_because.as_ref()) {
            p #ledger-forgotten {
                span.bad { "The ledger cached other topics" } " and was filled again from the cluster's: " (why)
            }
        }
        @if !health.failing_topics.is_empty() {
            table #failing-topics {
                tr { th { "topic refused" } th { "why" } }
                @for (topic, why) in &health.failing_topics {
                    tr { td.bad { (topic) } td { (why) } }
                }
            }
        }
    }
}

/// The search box and the page links (no script: a form that GETs).
fn search(shown: &Shown) -> Markup {
    let first = shown.page * shown.per_page;
    html! {
        form #search method="get" action="" {
            input type="search" name="q" value=(shown.query) placeholder="provider or source name";
            " " button type="submit" { "search" }
            " "
            @if shown.matched == 0 {
                "no source matches (of " (shown.total) ")"
            } @else {
                "sources " (first + 1) "–" ((first + shown.per_page).min(shown.matched))
                " of " (shown.matched)
                @if shown.matched != shown.total { " matching (of " (shown.total) ")" }
            }
            @if shown.page > 0 {
                " " a href=(shown.link(shown.page - 1)) { "← previous" }
            }
            @if shown.page + 1 < shown.pages() {
                " " a href=(shown.link(shown.page + 1)) { "next →" }
            }
        }
    }
}

fn state_cell(state: &str) -> Markup {
    let class = if state == "ok" || state == "not used" {
        "ok"
    } else {
        "bad"
    };
    html! { span class=(class) { (state) } }
}

fn source_section(source: &SourceSnapshot) -> Markup {
    html! {
        section.source id={ (source.provider) "-" (source.source) } {
            h2 { (source.provider) " / " (source.source) }
            @match &source.webhook {
                None => p { "Webhook: not watched (no webhook id / endpoint key configured for the watchdog)." },
                Some(seen) => p.webhook {
                    "Webhook: "
                    @if seen.state == "active" {
                        span.ok { "active" }
                    } @else {
                        span.bad { @if seen.state == "unknown" { "unknown" } @else { "switched off / paused" } }
                        @if let Some(detail) = &seen.detail { " (" (detail) ")" }
                    }
                    @if seen.resumed { ", switched back on by the watchdog" }
                    "; checked " (time_text(seen.checked_at))
                    "; last seen active " (seen.last_seen_active.map_or("never".to_owned(), time_text)) "."
                },
            }
            table.counts {
                tr {
                    th {}
                    @for (_, title) in COLUMNS { th { (title) } }
                }
                @for (label, counts) in [("last 5 min", &source.last_5_min), ("last hour", &source.last_hour)] {
                    tr {
                        th { (label) }
                        @for (key, _) in COLUMNS { td.n { (counts.get(key).copied().unwrap_or(0)) } }
                    }
                }
            }
            p {
                "Signature failures since start: " (source.signature_failures)
                @if let Some(at) = source.last_signature_failure { ", the last at " (time_text(at)) }
                "."
            }
            div.charts {
                (svg(|html| chart::answers(html, &source.per_minute)))
                (svg(|html| chart::p99(html, &source.per_minute)))
            }
            table.recent {
                tr {
                    th { "time" } th { "delivery id" } th { "event type" } th { "entity key" }
                    th { "outcome" } th { "latency" }
                }
                @if source.recent.is_empty() {
                    tr { td colspan="6" { "No deliveries since start." } }
                }
                @for delivery in &source.recent {
                    tr {
                        td { (time_text(delivery.at)) }
                        td { (delivery.delivery_id.as_deref().unwrap_or("")) }
                        td { (delivery.event_type.as_deref().unwrap_or("")) }
                        td { (delivery.entity_key.as_deref().unwrap_or("")) }
                        td {
                            @if (200..300).contains(&delivery.answer.status) {
                                (delivery.answer.outcome.replace('_', "-"))
                                @if let Some(reason) = delivery.dead_letter_reason { " (" (reason) ")" }
                            } @else {
                                (delivery.answer.status) " " (delivery.answer.outcome)
                            }
                        }
                        td.n { (format!("{:.1}", delivery.latency_ms)) " ms" }
                    }
                }
            }
            @match &source.reconcile {
                None => p { "Reconciler: no run since start." },
                Some(run) => p.reconcile {
                    "Last reconcile run: "
                    @match run.window {
                        None => "each list from its checkpoint",
                        Some(w) => { "window " (time_text(w.from)) " to " (time_text(w.to)) }
                    }
                    ", ended " (time_text(run.finished_at)) ": " (run.records) " records read, "
                    (run.published) " published, " (run.dead_lettered) " dead-lettered; "
                    (state_cell(&run.result)) "."
                },
            }
        }
    }
}

/// A chart's SVG, drawn by `chart.rs` from numbers and our own labels, as markup.
fn svg(draw: impl FnOnce(&mut String)) -> PreEscaped<String> {
    let mut svg = String::new();
    draw(&mut svg);
    PreEscaped(svg)
}

/// A time to the second, UTC (`/status.json` has them whole, RFC 3339).
fn time_text(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    at.format(format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second]Z"
    ))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;
    use crate::domain::event::ProviderKind;
    use crate::observe::board::{Answer, Board, Delivery, WebhookSeen};

    const HOSTILE: &str = "<script>alert('x')</script>&\"";

    fn page_with_hostile_strings() -> String {
        let now = datetime!(2026-12-03 10:00:00 UTC);
        let board = Board::new([(ProviderKind::Mekari, "main".to_owned())]);
        board.delivered(
            ProviderKind::Mekari,
            "main",
            Delivery {
                at: now,
                delivery_id: Some(HOSTILE.into()),
                event_type: Some(HOSTILE.into()),
                entity_key: Some(HOSTILE.to_owned()),
                dead_letter_reason: Some("invalid_field"),
                answer: Answer {
                    outcome: "dead_lettered",
                    status: 200,
                },
                latency_ms: 1.5,
            },
        );
        board.webhook_checked(
            ProviderKind::Mekari,
            "main",
            WebhookSeen {
                state: "off",
                detail: Some(HOSTILE.to_owned()),
                resumed: false,
                checked_at: now,
                last_seen_active: None,
            },
        );
        render(&Status {
            generated_at: now,
            health: Health {
                broker: "ok",
                ledger: HOSTILE.to_owned(),
                ledger_rebuild: None,
                schema_registry: "not used",
                spool: None,
                spool_depth_per_minute: Vec::new(),
                dead_letters_since_start: 1,
                failing_topics: [(HOSTILE.to_owned(), HOSTILE.to_owned())].into(),
            },
            sources: board.snapshot(now),
            shown: Shown::default(),
            refused_source_files: vec![super::super::RefusedFile {
                path: "mekari.shop.toml".into(),
                reason: HOSTILE.to_owned(),
            }],
        })
    }

    #[test]
    fn provider_sent_strings_are_text_never_markup() {
        let page = page_with_hostile_strings();
        assert!(!page.contains("<script>"), "{page}");
        // Delivery id, event type, key, the webhook's detail, the ledger's
        // error, the failing topic with its reason and a refused source
        // file's reason: eight places.
        let escaped = "&lt;script&gt;alert('x')&lt;/script&gt;&amp;&quot;";
        assert_eq!(page.matches(escaped).count(), 8, "{page}");
    }

    #[test]
    fn a_dead_letter_shows_its_reason_and_the_webhook_its_state() {
        let page = page_with_hostile_strings();
        assert!(
            page.contains("<td>dead-lettered (invalid_field)</td>"),
            "{page}"
        );
        assert!(
            page.contains("<span class=\"bad\">switched off / paused</span>"),
            "{page}"
        );
        assert!(page.contains("<td class=\"n\">1.5 ms</td>"), "{page}");
        assert!(
            page.starts_with("<!DOCTYPE html><html lang=\"en\">"),
            "{page}"
        );
    }

    #[test]
    fn damaged_spool_entries_in_quarantine_show_beside_the_spool() {
        let now = datetime!(2026-12-03 10:00:00 UTC);
        let page = render(&Status {
            generated_at: now,
            health: Health {
                broker: "down",
                ledger: "ok".to_owned(),
                ledger_rebuild: None,
                schema_registry: "not used",
                spool: Some(SpoolStats {
                    entries: 2,
                    bytes: 900,
                    has_room: true,
                    writable: true,
                    quarantined: 1,
                }),
                spool_depth_per_minute: Vec::new(),
                dead_letters_since_start: 0,
                failing_topics: Default::default(),
            },
            sources: Board::new([]).snapshot(now),
            shown: Shown::default(),
            refused_source_files: Vec::new(),
        });
        assert!(
            page.contains(
                "2 waiting, 900 bytes, <span class=\"bad\">1 damaged in quarantine</span>"
            ),
            "{page}"
        );
    }
}
