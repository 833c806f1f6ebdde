//! What reading a webhook body costs, in one run: posbridge's way (the body
//! parsed into a tree borrowing from its bytes, normalized into the event,
//! its business content written in canonical form, the guard's state hash)
//! beside three others over the same bytes: parsed into a `serde_json::Value`
//! alone (what posbridge parsed into before), into posbridge's tree alone,
//! and only tokenized, into `IgnoredAny` (the floor any reading of the body
//! pays). `benches/allocations.rs` counts the same calls' allocations.
//!
//! Run with `cargo bench --bench normalize`. Prints figures; asserts
//! nothing about speed.

use std::hint::black_box;
use std::time::{Duration, Instant};

use posbridge::adapters::providers::{self, Json};
use posbridge::domain::event::ProviderKind;
use posbridge::domain::guard::state_hash;
use serde::de::IgnoredAny;
use serde_json::Value;

#[path = "shared/sale.rs"]
mod sale;

/// Runs `work` `rounds` times and returns the time per call.
fn time_per(rounds: u32, mut work: impl FnMut() -> usize) -> Duration {
    let started = Instant::now();
    let mut sum = 0;
    for _ in 0..rounds {
        sum += black_box(work());
    }
    black_box(sum);
    started.elapsed() / rounds
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("normalize bench: run it with `cargo bench --bench normalize`");
        return;
    }
    let body = sale::body();
    let source = sale::source();
    let ctx = sale::context(&source, &body);
    let provider = providers::for_kind(ProviderKind::ReceiptRoller);
    let posbridge = || {
        let json = Json::parse(&body).expect("json");
        let normalized = provider.normalize(&json, &ctx).expect("normalizes");
        state_hash(&normalized.event, &normalized.content)[0] as usize
    };
    let value = || {
        let json: Value = serde_json::from_slice(&body).expect("json");
        json.as_object().map_or(0, serde_json::Map::len)
    };
    let tree = || match Json::parse(&body).expect("json") {
        Json::Object(members) => members.len(),
        _ => 0,
    };
    let tokens = || {
        serde_json::from_slice::<IgnoredAny>(&body).expect("json");
        1
    };
    let rounds = 200_000;
    println!("{} bytes a body, {rounds} rounds each", body.len());
    for repetition in 1..=3 {
        let ours = time_per(rounds, posbridge);
        let value = time_per(rounds, value);
        let tree = time_per(rounds, tree);
        let ignored = time_per(rounds, tokens);
        println!(
            "rep {repetition}: posbridge {:.2} µs | Value alone {:.2} µs | tree alone {:.2} µs | tokens alone {:.2} µs | posbridge beyond tokenizing {:.2} µs",
            ours.as_secs_f64() * 1e6,
            value.as_secs_f64() * 1e6,
            tree.as_secs_f64() * 1e6,
            ignored.as_secs_f64() * 1e6,
            (ours.as_secs_f64() - ignored.as_secs_f64()) * 1e6
        );
    }
}
