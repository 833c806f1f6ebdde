//! The operator's page, rendered on the server from a [`Status`]: one HTML
//! document with its style and charts inline (no scripts, no external
//! assets, nothing to build), refreshed by the browser every 10 s. Every
//! value that came from a provider (delivery ids, event types, keys) is
//! escaped.

use std::fmt::Write as _;

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
    /// Every configured source.
    pub sources: Vec<SourceSnapshot>,
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

/// The HTML page.
pub fn render(status: &Status) -> String {
    let mut html = String::with_capacity(16 * 1024);
    html.push_str(concat!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta http-equiv=\"refresh\" content=\"10\">",
        "<title>posbridge status</title><style>",
        "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}",
        "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}",
        "table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .6em;border:1px solid #ddd;text-align:left}",
        "th{background:#f4f4f4}td.n{text-align:right}.ok{color:#176f2c}.bad{color:#b00020;font-weight:bold}",
        ".charts .chart{display:inline-block;vertical-align:top;margin:0 1em .5em 0;max-width:542px}.charts svg{border:1px solid #ddd;background:#fcfcfc}",
        ".legend{margin:.2em 0}",
        ".legend span{margin-right:1em;white-space:nowrap}.legend i{display:inline-block;width:.8em;height:.8em;margin-right:.3em;vertical-align:-.05em}",
        "</style></head><body>"
    ));
    let _ = write!(
        html,
        "<h1>posbridge</h1><p>As of {} (refreshes every 10 s).</p>",
        time_text(status.generated_at)
    );
    health(&mut html, &status.health);
    for source in &status.sources {
        source_section(&mut html, source);
    }
    html.push_str("</body></html>");
    html
}

fn health(html: &mut String, health: &Health) {
    html.push_str("<table id=\"health\"><tr><th>broker</th><th>ledger</th><th>schema registry</th><th>spool</th><th>dead letters since start</th></tr><tr>");
    let _ = write!(
        html,
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td></tr></table>",
        state_cell(health.broker),
        state_cell(&health.ledger),
        state_cell(health.schema_registry),
        match health.spool {
            None => "not used".to_owned(),
            Some(spool) => format!(
                "{} waiting, {} bytes{}",
                spool.entries,
                spool.bytes,
                match (spool.writable, spool.has_room) {
                    (false, _) => ", <span class=\"bad\">cannot write</span>",
                    (true, false) => ", <span class=\"bad\">full</span>",
                    (true, true) => "",
                }
            ),
        },
        health.dead_letters_since_start
    );
    if health.spool.is_some() {
        html.push_str("<div class=\"charts\">");
        chart::spool(html, &health.spool_depth_per_minute);
        html.push_str("</div>");
    }
    if !health.failing_topics.is_empty() {
        html.push_str("<table id=\"failing-topics\"><tr><th>topic refused</th><th>why</th></tr>");
        for (topic, why) in &health.failing_topics {
            let _ = write!(
                html,
                "<tr><td class=\"bad\">{}</td><td>{}</td></tr>",
                escape(topic),
                escape(why)
            );
        }
        html.push_str("</table>");
    }
}

fn state_cell(state: &str) -> String {
    let class = if state == "ok" || state == "not used" {
        "ok"
    } else {
        "bad"
    };
    format!("<span class=\"{class}\">{}</span>", escape(state))
}

fn source_section(html: &mut String, source: &SourceSnapshot) {
    let _ = write!(
        html,
        "<section class=\"source\" id=\"{p}-{s}\"><h2>{p} / {s}</h2>",
        p = source.provider,
        s = escape(&source.source)
    );
    match &source.webhook {
        None => html.push_str("<p>Webhook: not watched (no webhook id / endpoint key configured for the watchdog).</p>"),
        Some(seen) => {
            let state = if seen.state == "active" {
                "<span class=\"ok\">active</span>".to_owned()
            } else if seen.state == "unknown" {
                format!(
                    "<span class=\"bad\">unknown</span>{}",
                    seen.detail.as_deref().map(|d| format!(" ({})", escape(d))).unwrap_or_default()
                )
            } else {
                format!(
                    "<span class=\"bad\">switched off / paused</span>{}",
                    seen.detail.as_deref().map(|d| format!(" ({})", escape(d))).unwrap_or_default()
                )
            };
            let _ = write!(
                html,
                "<p class=\"webhook\">Webhook: {state}{}; checked {}; last seen active {}.</p>",
                if seen.resumed { ", switched back on by the watchdog" } else { "" },
                time_text(seen.checked_at),
                seen.last_seen_active.map_or("never".to_owned(), time_text),
            );
        }
    }
    html.push_str("<table class=\"counts\"><tr><th></th>");
    for (_, title) in COLUMNS {
        let _ = write!(html, "<th>{title}</th>");
    }
    html.push_str("</tr>");
    for (label, counts) in [
        ("last 5 min", &source.last_5_min),
        ("last hour", &source.last_hour),
    ] {
        let _ = write!(html, "<tr><th>{label}</th>");
        for (key, _) in COLUMNS {
            let _ = write!(
                html,
                "<td class=\"n\">{}</td>",
                counts.get(key).copied().unwrap_or(0)
            );
        }
        html.push_str("</tr>");
    }
    html.push_str("</table>");
    let _ = write!(
        html,
        "<p>Signature failures since start: {}{}.</p>",
        source.signature_failures,
        source
            .last_signature_failure
            .map(|at| format!(", the last at {}", time_text(at)))
            .unwrap_or_default()
    );
    html.push_str("<div class=\"charts\">");
    chart::answers(html, &source.per_minute);
    chart::p99(html, &source.per_minute);
    html.push_str("</div>");
    html.push_str("<table class=\"recent\"><tr><th>time</th><th>delivery id</th><th>event type</th><th>entity key</th><th>outcome</th><th>latency</th></tr>");
    if source.recent.is_empty() {
        html.push_str("<tr><td colspan=\"6\">No deliveries since start.</td></tr>");
    }
    for delivery in &source.recent {
        let outcome = if (200..300).contains(&delivery.answer.status) {
            let outcome = delivery.answer.outcome.replace('_', "-");
            match delivery.dead_letter_reason {
                Some(reason) => format!("{outcome} ({})", escape(reason)),
                None => outcome,
            }
        } else {
            format!("{} {}", delivery.answer.status, delivery.answer.outcome)
        };
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{:.1} ms</td></tr>",
            time_text(delivery.at),
            escape(delivery.delivery_id.as_deref().unwrap_or("")),
            escape(delivery.event_type.as_deref().unwrap_or("")),
            escape(delivery.entity_key.as_deref().unwrap_or("")),
            outcome,
            delivery.latency_ms
        );
    }
    html.push_str("</table>");
    match &source.reconcile {
        None => html.push_str("<p>Reconciler: no run since start.</p>"),
        Some(run) => {
            let window = run
                .window
                .map_or("each list from its checkpoint".to_owned(), |w| {
                    format!("window {} to {}", time_text(w.from), time_text(w.to))
                });
            let _ = write!(
                html,
                "<p class=\"reconcile\">Last reconcile run: {window}, ended {}: {} records read, {} published, {} dead-lettered; {}.</p>",
                time_text(run.finished_at),
                run.records,
                run.published,
                run.dead_lettered,
                state_cell(&run.result)
            );
        }
    }
    html.push_str("</section>");
}

/// A time to the second, UTC (`/status.json` has them whole, RFC 3339).
fn time_text(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    at.format(format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second]Z"
    ))
    .unwrap_or_default()
}

/// Text as HTML: provider-controlled strings never become markup.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
