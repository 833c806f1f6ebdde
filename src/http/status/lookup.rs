//! The status page's lookup (`/status/lookup?id=…`): what one text names,
//! as a delivery id and, when it has a provider's prefix, as an entity key,
//! in one page (no script, no refresh). Every value is escaped by the
//! template, provider-sent text included.

use maud::{DOCTYPE, Markup, html};

use super::page::head;
use crate::services::lookup::{DeliveryReport, EntityReport, RecordView};

/// What a lookup found, or why it could not look.
pub struct Looked {
    /// The text looked up.
    pub id: String,
    /// As a delivery id.
    pub delivery: Result<DeliveryReport, String>,
    /// As an entity key, when it has a provider's prefix.
    pub entity: Option<Result<EntityReport, String>>,
}

/// The lookup page.
pub fn render(looked: &Looked) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(html! { "posbridge lookup: " (looked.id) }, false))
            body {
                h1 { "posbridge lookup" }
                (form(&looked.id, Page::Lookup))
                p { a href="../status" { "← status" } }
                h2 { "As a delivery id" }
                @match &looked.delivery {
                    Err(why) => p.bad #delivery-error { "cannot look: " (why) },
                    Ok(report) => (delivery(report)),
                }
                @if let Some(entity_report) = &looked.entity {
                    h2 { "As an entity key" }
                    @match entity_report {
                        Err(why) => p.bad #entity-error { "cannot look: " (why) },
                        Ok(report) => (entity(report)),
                    }
                }
            }
        }
    }
    .into_string()
}

/// The page a lookup box is on: its action is relative to it, so the
/// pages work behind a path prefix.
pub enum Page {
    /// `/status`.
    Status,
    /// `/status/lookup`.
    Lookup,
}

/// The lookup box, on the status page and on this one.
pub fn form(id: &str, on: Page) -> Markup {
    let action = match on {
        Page::Status => "status/lookup",
        Page::Lookup => "lookup",
    };
    html! {
        form #lookup method="get" action=(action) {
            input type="search" name="id" value=(id) placeholder="delivery id or entity key" size="40";
            " " button type="submit" { "look up" }
        }
    }
}

fn delivery(report: &DeliveryReport) -> Markup {
    html! {
        @if let Some(note) = &report.note {
            p #delivery-note { (note) }
        }
        @if let Some(note) = report.ledger_note {
            p.bad { (note) }
        }
        @for found in &report.found {
            table.delivery {
                tr { th { "delivery" } td { (found.key) } }
                tr { th { "state" } td { (found.state) } }
                @if let Some(outcome) = found.outcome {
                    tr { th { "answered" } td.outcome { (outcome) } }
                }
                @if let Some(at) = &found.answered_at {
                    tr { th { "answered at" } td { (at) } }
                }
                @if let Some(until) = &found.remembered_until {
                    tr { th { "remembered until" } td { (until) } }
                }
                @if let Some(record) = &found.record {
                    tr {
                        th { "record" }
                        td { (record.at.topic) " partition " (record.at.partition) " offset " (record.at.offset) }
                    }
                    @if let Some(note) = &record.note {
                        tr { th { "note" } td.bad { (note) } }
                    }
                }
            }
            @if let Some(read) = found.record.as_ref().and_then(|record| record.read.as_ref()) {
                (record(read))
            }
        }
    }
}

fn entity(report: &EntityReport) -> Markup {
    html! {
        @if report.found.is_empty() {
            p #entity-none { "No entity topic holds a record of this key, and the ledger holds no state of it." }
        }
        @if let Some(note) = report.ledger_note {
            p.bad { (note) }
        }
        @if let Some(note) = &report.topics_note {
            p.bad { (note) }
        }
        @for topic in &report.found {
            h3 {
                (topic.topic)
                @if let Some(partition) = topic.partition { " partition " (partition) }
            }
            @if let Some(state) = &topic.ledger_state {
                p {
                    "Ledger state: version " (state.version) ", state hash " (state.state_hash)
                    @if let Some(offset) = state.offset { ", written at offset " (offset) }
                }
            }
            @for read in &topic.records {
                (record(read))
            }
        }
    }
}

/// A record: its place and headers, and its value as indented JSON.
fn record(read: &RecordView) -> Markup {
    let value = read
        .value
        .as_ref()
        .map(|value| serde_json::to_string_pretty(value).unwrap_or_default());
    html! {
        details.record open {
            summary { "offset " (read.offset) }
            table {
                @for (name, value) in &read.headers {
                    tr { th { (name) } td { (value) } }
                }
            }
            @if let Some(error) = &read.error {
                p.bad { (error) }
            }
            @match (value, &read.error) {
                (Some(value), _) => pre { (value) },
                (None, None) => p { "(tombstone)" },
                (None, Some(_)) => {},
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a provider sent is text on the page, never markup.
    #[test]
    fn a_looked_up_text_is_escaped() {
        let html = render(&Looked {
            id: "<script>alert(1)</script>".to_owned(),
            delivery: Err("<b>down</b>".to_owned()),
            entity: None,
        });
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("&lt;b&gt;down&lt;/b&gt;"));
        // From /status/lookup, the box asks /status/lookup again.
        assert!(html.contains(r#"action="lookup""#), "{html}");
    }
}
