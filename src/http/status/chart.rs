//! The status page's charts, drawn as inline SVG on the server: answers per
//! minute by outcome, p99 latency per minute, and the spool's depth, each
//! over the last hour with the oldest minute on the left.
//!
//! They are read at a glance, so each has a scale (its top value and 0), a
//! time axis, and says so in words when there is nothing to draw rather
//! than showing an empty box. A minute with any answer always gets a
//! visible mark: a bar segment is at least [`MIN_MARK`] pixels high, and a
//! p99 value is a dot, joined by a line only to the minute next to it.

use std::fmt::Write as _;

use crate::observe::board::MinuteSnapshot;

/// The whole drawing's size, and the plot's place in it.
const WIDTH: f64 = 540.0;
const HEIGHT: f64 = 120.0;
const LEFT: f64 = 48.0;
const TOP: f64 = 8.0;
const PLOT_W: f64 = WIDTH - LEFT - 8.0;
const PLOT_H: f64 = 84.0;
/// The least height of a bar segment standing for at least one answer.
const MIN_MARK: f64 = 2.0;

/// What the answers chart stacks, bottom up: a title, a colour, and the
/// page's count keys (`Answer::count_key`) it gathers. A key of no series
/// (a 4xx refusal) is "refused".
pub const SERIES: [(&str, &str, &[&str]); 7] = [
    ("published", "#2f6fd0", &["published"]),
    ("duplicate", "#8fa3bf", &["duplicate"]),
    ("not newer", "#b59fe0", &["stale", "unchanged"]),
    ("dead-lettered", "#e8930c", &["dead_lettered"]),
    ("spooled", "#14a3b8", &["spooled"]),
    ("503", "#d9262b", &["503"]),
    ("refused", "#7a4a1e", &[]),
];
/// The p99 chart's colour.
pub const P99_COLOUR: &str = "#7b2fa8";
/// The spool chart's colour.
pub const SPOOL_COLOUR: &str = "#3f5663";

/// The series a count key belongs to.
fn series_of(key: &str) -> usize {
    SERIES
        .iter()
        .position(|(_, _, keys)| keys.contains(&key))
        .unwrap_or(SERIES.len() - 1)
}

/// Answers per minute, stacked by outcome, with a legend of the hour's
/// totals (only the outcomes that occurred).
pub fn answers(html: &mut String, minutes: &[MinuteSnapshot]) {
    let per_minute: Vec<[u64; SERIES.len()]> = minutes
        .iter()
        .map(|m| {
            let mut counts = [0; SERIES.len()];
            for (key, n) in &m.answers {
                counts[series_of(key)] += n;
            }
            counts
        })
        .collect();
    let peak = per_minute
        .iter()
        .map(|c| c.iter().sum::<u64>())
        .max()
        .unwrap_or(0);
    let scale = nice_ceiling(peak as f64);
    let step = PLOT_W / minutes.len().max(1) as f64;
    open(html, "answers", "answers per minute by outcome, last hour");
    axes(html, &format!("{scale}"), "/min");
    for (i, counts) in per_minute.iter().enumerate() {
        let mut y = TOP + PLOT_H;
        for (series, &n) in counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let h = (n as f64 / scale * PLOT_H).max(MIN_MARK).min(y - TOP);
            y -= h;
            let _ = write!(
                html,
                "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\"><title>{} min ago: {n} {}</title></rect>",
                LEFT + i as f64 * step,
                (step - 2.0).max(1.0),
                SERIES[series].1,
                minutes[i].minutes_ago,
                SERIES[series].0,
            );
        }
    }
    if peak == 0 {
        nothing(html, "no answers in the last hour");
    }
    let mut totals = [0u64; SERIES.len()];
    for counts in &per_minute {
        for (total, n) in totals.iter_mut().zip(counts) {
            *total += n;
        }
    }
    let mut legend = String::from("<p class=\"legend\">");
    for (series, total) in totals.iter().enumerate().filter(|(_, t)| **t > 0) {
        let _ = write!(
            legend,
            "<span><i style=\"background:{}\"></i>{} {total}</span>",
            SERIES[series].1, SERIES[series].0
        );
    }
    legend.push_str("</p>");
    close(html, &legend);
}

/// The p99 latency of each minute with answers: a dot per minute, joined
/// to the next minute's when that had answers too.
pub fn p99(html: &mut String, minutes: &[MinuteSnapshot]) {
    let slowest = minutes
        .iter()
        .filter_map(|m| m.p99_ms)
        .fold(0.0_f64, f64::max);
    let scale = nice_ceiling(slowest);
    let step = PLOT_W / minutes.len().max(1) as f64;
    let at = |i: usize, ms: f64| {
        (
            LEFT + i as f64 * step + step / 2.0,
            TOP + PLOT_H - (ms / scale).min(1.0) * PLOT_H,
        )
    };
    open(html, "p99", "p99 latency per minute, last hour");
    axes(html, &format!("{scale} ms"), "");
    for (i, pair) in minutes.windows(2).enumerate() {
        if let (Some(a), Some(b)) = (pair[0].p99_ms, pair[1].p99_ms) {
            let ((x1, y1), (x2, y2)) = (at(i, a), at(i + 1, b));
            let _ = write!(
                html,
                "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{P99_COLOUR}\" stroke-width=\"2\"/>"
            );
        }
    }
    for (i, minute) in minutes.iter().enumerate() {
        if let Some(ms) = minute.p99_ms {
            let (x, y) = at(i, ms);
            let _ = write!(
                html,
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3.5\" fill=\"{P99_COLOUR}\"><title>{} min ago: p99 {ms:.1} ms</title></circle>",
                minute.minutes_ago
            );
        }
    }
    if slowest == 0.0 {
        nothing(html, "no answers in the last hour");
    }
    close(html, "");
}

/// The spool's depth: the deepest it was in each minute.
pub fn spool(html: &mut String, depths: &[u64]) {
    let deepest = depths.iter().copied().max().unwrap_or(0);
    let scale = nice_ceiling(deepest as f64);
    let step = PLOT_W / depths.len().max(1) as f64;
    open(html, "spool", "spool depth, deepest per minute, last hour");
    axes(html, &format!("{scale}"), "waiting");
    for (i, &depth) in depths.iter().enumerate().filter(|(_, d)| **d > 0) {
        let h = (depth as f64 / scale * PLOT_H).max(MIN_MARK);
        let _ = write!(
            html,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{SPOOL_COLOUR}\"><title>{} min ago: {depth} waiting</title></rect>",
            LEFT + i as f64 * step,
            TOP + PLOT_H - h,
            (step - 2.0).max(1.0),
            depths.len() - 1 - i,
        );
    }
    if deepest == 0 {
        nothing(html, "the spool was empty all hour");
    }
    close(html, "");
}

/// The chart's box and its `<svg>` element with its label, both left
/// open ([`close`] ends them).
fn open(html: &mut String, class: &str, label: &str) {
    let _ = write!(
        html,
        "<div class=\"chart\"><svg class=\"{class}\" width=\"{WIDTH}\" height=\"{}\" role=\"img\" aria-label=\"{label}\"><title>{label}</title><text x=\"{LEFT}\" y=\"{}\" font-size=\"11\" fill=\"#444\">{label}</text>",
        HEIGHT + 14.0,
        HEIGHT + 12.0,
    );
}

/// Ends the `<svg>` (and what follows it in the box, `after`) and the box.
fn close(html: &mut String, after: &str) {
    html.push_str("</svg>");
    html.push_str(after);
    html.push_str("</div>");
}

/// The plot's frame: the scale's top value and 0 on the left, the time
/// axis below.
fn axes(html: &mut String, top: &str, unit: &str) {
    let bottom = TOP + PLOT_H;
    let right = LEFT + PLOT_W;
    let _ = write!(
        html,
        concat!(
            "<line x1=\"{l}\" y1=\"{t}\" x2=\"{r}\" y2=\"{t}\" stroke=\"#ddd\"/>",
            "<line x1=\"{l}\" y1=\"{m}\" x2=\"{r}\" y2=\"{m}\" stroke=\"#eee\"/>",
            "<line x1=\"{l}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#999\"/>",
            "<text x=\"{lt}\" y=\"{tt}\" font-size=\"10\" text-anchor=\"end\" fill=\"#444\">{top}</text>",
            "<text x=\"{lt}\" y=\"{tu}\" font-size=\"10\" text-anchor=\"end\" fill=\"#666\">{unit}</text>",
            "<text x=\"{lt}\" y=\"{b}\" font-size=\"10\" text-anchor=\"end\" fill=\"#444\">0</text>",
            "<text x=\"{l}\" y=\"{xb}\" font-size=\"10\" fill=\"#666\">60 min ago</text>",
            "<text x=\"{r}\" y=\"{xb}\" font-size=\"10\" text-anchor=\"end\" fill=\"#666\">now</text>",
        ),
        l = LEFT,
        r = right,
        t = TOP,
        m = TOP + PLOT_H / 2.0,
        b = bottom,
        lt = LEFT - 4.0,
        tt = TOP + 8.0,
        tu = TOP + 20.0,
        xb = bottom + 12.0,
        top = top,
        unit = unit,
    );
}

/// Words in the middle of an empty plot.
fn nothing(html: &mut String, what: &str) {
    let _ = write!(
        html,
        "<text class=\"nothing\" x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#888\">{what}</text>",
        LEFT + PLOT_W / 2.0,
        TOP + PLOT_H / 2.0 + 4.0
    );
}

/// The smallest of 1, 2, 5 × 10ⁿ at or above `value` (1 for nothing): a
/// scale whose top reads as a round number.
fn nice_ceiling(value: f64) -> f64 {
    if value <= 0.0 || !value.is_finite() {
        return 1.0;
    }
    let mut power = 10f64.powf(value.log10().floor());
    loop {
        for factor in [1.0, 2.0, 5.0] {
            let nice = factor * power;
            if nice >= value * (1.0 - 1e-9) {
                return nice;
            }
        }
        power *= 10.0;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn minutes(answers: &[(usize, &str, u64, Option<f64>)]) -> Vec<MinuteSnapshot> {
        (0..60)
            .rev()
            .map(|ago| {
                let mut snapshot = MinuteSnapshot {
                    minutes_ago: ago,
                    requests: 0,
                    answers: BTreeMap::new(),
                    p99_ms: None,
                };
                for (at, key, n, p99) in answers {
                    if *at as i64 == ago {
                        snapshot.requests += n;
                        snapshot.answers.insert((*key).to_owned(), *n);
                        snapshot.p99_ms = *p99;
                    }
                }
                snapshot
            })
            .collect()
    }

    #[test]
    fn scales_read_as_round_numbers() {
        let cases = [
            (0.0, 1.0),
            (1.0, 1.0),
            (1.5, 2.0),
            (3.0, 5.0),
            (9.5, 10.0),
            (10.0, 10.0),
            (51.0, 100.0),
            (0.3, 0.5),
            (1234.0, 2000.0),
        ];
        for (value, nice) in cases {
            assert_eq!(nice_ceiling(value), nice, "{value}");
        }
    }

    #[test]
    fn two_answers_in_the_last_minute_draw_a_bar_a_dot_and_a_legend() {
        let minutes = minutes(&[
            (0, "published", 1, Some(9.5)),
            (0, "duplicate", 1, Some(9.5)),
        ]);
        let mut html = String::new();
        answers(&mut html, &minutes);
        p99(&mut html, &minutes);
        assert_eq!(html.matches("<rect").count(), 2, "{html}");
        assert!(html.contains("0 min ago: 1 published"), "{html}");
        assert_eq!(html.matches("<circle").count(), 1, "{html}");
        assert!(html.contains("p99 9.5 ms"), "{html}");
        assert!(html.contains(">10 ms<"), "the scale's top: {html}");
        assert!(html.contains("published 1</span>") && html.contains("duplicate 1</span>"));
        assert!(!html.contains("no answers"), "{html}");
    }

    #[test]
    fn refusals_and_not_newer_answers_gather_in_their_series() {
        let minutes = minutes(&[
            (3, "401", 2, None),
            (5, "stale", 1, None),
            (5, "unchanged", 1, None),
        ]);
        let mut html = String::new();
        answers(&mut html, &minutes);
        assert!(html.contains("refused 2</span>"), "{html}");
        assert!(html.contains("not newer 2</span>"), "{html}");
    }

    #[test]
    fn a_quiet_hour_says_so_instead_of_an_empty_box() {
        let minutes = minutes(&[]);
        let mut html = String::new();
        answers(&mut html, &minutes);
        p99(&mut html, &minutes);
        spool(&mut html, &[0; 60]);
        assert_eq!(html.matches("no answers in the last hour").count(), 2);
        assert!(html.contains("the spool was empty all hour"));
        assert!(!html.contains("<rect") && !html.contains("<circle"));
    }

    #[test]
    fn a_spooled_minute_is_a_bar_as_deep_as_the_spool_was() {
        let mut depths = [0; 60];
        depths[58] = 40;
        depths[59] = 3;
        let mut html = String::new();
        spool(&mut html, &depths);
        assert_eq!(html.matches("<rect").count(), 2);
        assert!(html.contains("1 min ago: 40 waiting") && html.contains("0 min ago: 3 waiting"));
        assert!(html.contains(">50<"), "the scale's top: {html}");
    }
}
