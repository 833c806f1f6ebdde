//! The alerting rules and the Grafana dashboard under `deploy/`, taken as an
//! operator's Prometheus takes them: promtool checks the rules and runs their
//! unit tests, in which every alert fires once and stays quiet once; every
//! alert links its runbook paragraph; Prometheus' parser accepts every
//! dashboard query; and a real posbridge's `/metrics` holds every series the
//! rules and the dashboard read, the rules' already at start-up.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use posbridge::domain::event::ProviderKind;
use promql_parser::label::MatchOp;
use promql_parser::parser::{Expr, VectorSelector};
use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

use crate::catch_up::{MEKARI_CLIENT_SECRET, Sim};
use crate::support::wait::{look_for, wait_until};
use crate::support::{
    brokers, config_text, free_port, listening_on, mekari_order, metric, rr_sale, signed_request,
    spawn_posbridge, spawn_serve, spool_config_text, unique, wait_healthy,
};

/// The alerting rules.
const RULES: &str = "deploy/prometheus/posbridge-alerts.yaml";
/// Their `promtool test rules` files.
const RULE_TESTS: &str = "deploy/prometheus/tests";
/// The Grafana dashboard.
const DASHBOARD: &str = "deploy/grafana/posbridge.json";
/// The runbook every alert links to.
const RUNBOOK: &str = "docs/ALERTS.md";
/// Overrides where promtool is looked for (else `PATH`).
const PROMTOOL_VAR: &str = "POSBRIDGE_TEST_PROMTOOL";

/// A path in this repository.
fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// promtool, from Debian's `prometheus` package: `POSBRIDGE_TEST_PROMTOOL`,
/// else the first on `PATH`.
fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os(PROMTOOL_VAR) {
        return path.into();
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("promtool"))
                .find(|path| path.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "promtool is not installed: Debian's `prometheus` package has it \
                 (apt-get install prometheus; .ci/run installs it), or set {PROMTOOL_VAR} to its path"
            )
        })
}

/// Runs promtool with `args`; its output, after asserting it succeeded.
fn run_promtool<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let output = Command::new(promtool()).args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool failed:\n{text}");
    text
}

fn yaml(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap();
    let mut docs = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()));
    assert_eq!(docs.len(), 1, "{}: one document", path.display());
    docs.remove(0)
}

/// One alerting rule, as the tests read it.
struct Alert {
    name: String,
    expr: String,
    severity: String,
    runbook_url: String,
}

/// Every alerting rule of [`RULES`].
fn alerts() -> Vec<Alert> {
    let rules = yaml(&repo(RULES));
    let text = |rule: &Yaml, key: &str| rule[key].as_str().unwrap_or_default().to_owned();
    let alerts: Vec<Alert> = rules["groups"]
        .as_vec()
        .expect("groups")
        .iter()
        .flat_map(|group| group["rules"].as_vec().expect("rules").iter())
        .map(|rule| Alert {
            name: text(rule, "alert"),
            expr: text(rule, "expr"),
            severity: text(&rule["labels"], "severity"),
            runbook_url: text(&rule["annotations"], "runbook_url"),
        })
        .collect();
    assert!(
        alerts
            .iter()
            .all(|a| !a.name.is_empty() && !a.expr.is_empty()),
        "{RULES} holds alerting rules only, each with an expression"
    );
    alerts
}

/// The rule test files, sorted.
fn rule_test_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo(RULE_TESTS))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no rule tests in {RULE_TESTS}");
    files
}

#[test]
fn promtool_passes_the_rules_and_their_tests_in_which_each_alert_fires_and_stays_quiet() {
    let checked = run_promtool([
        OsStr::new("check"),
        OsStr::new("rules"),
        repo(RULES).as_os_str(),
    ]);
    let alerts = alerts();
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{checked}"
    );
    let files = rule_test_files();
    let tested = run_promtool(
        ["test", "rules"]
            .map(OsStr::new)
            .into_iter()
            .chain(files.iter().map(|f| f.as_os_str())),
    );
    println!("{tested}");

    // promtool passes a test of an alert that does not exist (nothing
    // fires, as expected), and does not ask that every alert be tested.
    let (mut fired, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for file in &files {
        let doc = yaml(file);
        for test in doc["tests"].as_vec().expect("tests") {
            for case in test["alert_rule_test"].as_vec().expect("alert_rule_test") {
                let name = case["alertname"].as_str().unwrap().to_owned();
                let expected = case["exp_alerts"].as_vec().map_or(0, Vec::len);
                if expected > 0 {
                    fired.insert(name);
                } else {
                    quiet.insert(name);
                }
            }
        }
    }
    let names: BTreeSet<String> = alerts.iter().map(|a| a.name.clone()).collect();
    let unknown: Vec<&String> = fired
        .union(&quiet)
        .filter(|n| !names.contains(*n))
        .collect();
    assert!(
        unknown.is_empty(),
        "tests of alerts that do not exist: {unknown:?}"
    );
    for name in &names {
        assert!(fired.contains(name), "no test where {name} fires");
        assert!(quiet.contains(name), "no test where {name} stays quiet");
    }

    // Each alert links its own paragraph of the runbook, by a path in the repo.
    let runbook = std::fs::read_to_string(repo(RUNBOOK)).unwrap();
    for alert in &alerts {
        assert!(
            ["critical", "warning"].contains(&alert.severity.as_str()),
            "{}: severity {:?}",
            alert.name,
            alert.severity
        );
        assert_eq!(
            alert.runbook_url,
            format!("{RUNBOOK}#{}", alert.name.to_lowercase()),
            "{}'s runbook_url",
            alert.name
        );
        assert!(
            runbook.lines().any(|l| l == format!("### {}", alert.name)),
            "{RUNBOOK} has no heading `### {}`",
            alert.name
        );
    }
}

/// A dashboard query: where it is (for messages) and its PromQL.
struct Query {
    place: String,
    promql: String,
}

/// Every query of [`DASHBOARD`], panels' and variables', its Grafana
/// variables replaced by values Prometheus would be sent.
fn dashboard_queries() -> Vec<Query> {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(repo(DASHBOARD)).unwrap()).unwrap();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let mut queries = Vec::new();
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        let query = variable["query"]["query"]
            .as_str()
            .or_else(|| variable["query"].as_str())
            .unwrap();
        let selector = query
            .strip_prefix("label_values(")
            .and_then(|rest| rest.rsplit_once(','))
            .map(|(selector, _label)| selector)
            .unwrap_or_else(|| {
                panic!("variable query `{query}` is not label_values(series, label)")
            });
        queries.push(Query {
            place: format!("variable {}", variable["name"]),
            promql: selector.to_owned(),
        });
    }
    let mut panels: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(Query {
                place: format!("panel {}", panel["title"]),
                promql: target["expr"].as_str().unwrap().to_owned(),
            });
        }
    }
    let names: Vec<&str> = variables
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for query in &mut queries {
        let mut promql = query.promql.clone();
        for interval in ["$__rate_interval", "$__interval", "$__range"] {
            promql = promql.replace(interval, "5m");
        }
        // A variable stands in a matcher's regex (`=~"$provider"`): all values.
        for name in &names {
            promql = promql
                .replace(&format!("${{{name}}}"), ".*")
                .replace(&format!("${name}"), ".*");
        }
        assert!(
            !promql.contains('$'),
            "{}: a Grafana variable this test does not know: {}",
            query.place,
            query.promql
        );
        query.promql = promql;
    }
    assert!(queries.len() > 10, "the dashboard's queries were not found");
    queries
}

#[test]
fn prometheus_parses_every_dashboard_query() {
    // promtool checks PromQL with Prometheus' own parser: each query as a
    // recording rule.
    let dir = tempfile::tempdir().unwrap();
    let queries = dashboard_queries();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, query) in queries.iter().enumerate() {
        rules += &format!(
            "      - record: dashboard:query_{n}\n        expr: {}\n",
            serde_json::to_string(&query.promql).unwrap()
        );
    }
    let path = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&path, rules).unwrap();
    let checked = run_promtool([OsStr::new("check"), OsStr::new("rules"), path.as_os_str()]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );
}

/// The series names a PromQL expression reads (functions, label names and
/// label values are not names); `_bucket`, `_sum` and `_count` stay on, as
/// they are the names of the histogram's series on `/metrics`.
fn series_read(promql: &str) -> Result<BTreeSet<String>, String> {
    fn selector(vs: &VectorSelector, names: &mut BTreeSet<String>) -> Result<(), String> {
        let by_matcher = vs
            .matchers
            .matchers
            .iter()
            .find(|m| m.name == "__name__" && matches!(m.op, MatchOp::Equal))
            .map(|m| m.value.clone());
        match vs.name.clone().or(by_matcher) {
            Some(name) => {
                names.insert(name);
                Ok(())
            }
            None => Err(format!("a selector without a literal series name: {vs}")),
        }
    }
    fn walk(expr: &Expr, names: &mut BTreeSet<String>) -> Result<(), String> {
        match expr {
            Expr::Aggregate(e) => {
                walk(&e.expr, names)?;
                e.param.as_deref().map_or(Ok(()), |p| walk(p, names))
            }
            Expr::Unary(e) => walk(&e.expr, names),
            Expr::Binary(e) => {
                walk(&e.lhs, names)?;
                walk(&e.rhs, names)
            }
            Expr::Paren(e) => walk(&e.expr, names),
            Expr::Subquery(e) => walk(&e.expr, names),
            Expr::VectorSelector(vs) => selector(vs, names),
            Expr::MatrixSelector(ms) => selector(&ms.vs, names),
            Expr::Call(call) => call.args.args.iter().try_for_each(|arg| walk(arg, names)),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => Ok(()),
        }
    }
    let expr = promql_parser::parser::parse(promql)?;
    let mut names = BTreeSet::new();
    walk(&expr, &mut names)?;
    if names.is_empty() {
        return Err("reads no series".into());
    }
    Ok(names)
}

/// Series name → where it is read, for `(place, promql)` pairs.
fn names_read<'a>(
    queries: impl IntoIterator<Item = (String, &'a str)>,
) -> BTreeMap<String, Vec<String>> {
    let mut read: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (place, promql) in queries {
        let names = series_read(promql).unwrap_or_else(|e| panic!("{place}: {e}: {promql}"));
        for name in names {
            read.entry(name).or_default().push(place.clone());
        }
    }
    read
}

/// The series names on a `/metrics` page (the histograms' `_bucket`,
/// `_sum`, `_count` each by its own name).
fn exported(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| line[..line.find(['{', ' ']).unwrap_or(line.len())].to_owned())
        .collect()
}

fn assert_exported(read: &BTreeMap<String, Vec<String>>, metrics: &str, when: &str) {
    let exported = exported(metrics);
    let missing: Vec<String> = read
        .iter()
        .filter(|(name, _)| !exported.contains(*name))
        .map(|(name, places)| format!("{name} (read by {})", places.join(", ")))
        .collect();
    assert!(
        missing.is_empty(),
        "not on /metrics {when}:\n  {}\n/metrics:\n{metrics}",
        missing.join("\n  ")
    );
}

/// A `posbridge` process, killed on drop (a failed assertion too).
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_series_the_rules_and_the_dashboard_read_is_on_a_running_posbridges_metrics() {
    let alerts = alerts();
    let for_rules = names_read(
        alerts
            .iter()
            .map(|a| (format!("alert {}", a.name), a.expr.as_str())),
    );
    let queries = dashboard_queries();
    let for_dashboard = names_read(queries.iter().map(|q| (q.place.clone(), q.promql.as_str())));

    // Its own process, so its /metrics holds what it registered and nothing
    // another test of this binary recorded. The provider simulator serves
    // the APIs its reconciler and watchdog read; it sends no webhooks.
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let sim = Sim::start(&base, &["--events", "0"]).await;
    let dir = tempfile::tempdir().unwrap();
    // A source whose secret comes from a file: the secret files' gauges.
    let secret_file = dir.path().join("mekari.secret");
    std::fs::write(&secret_file, "from-a-file\n").unwrap();
    let text = listening_on(
        &spool_config_text(&brokers(), &unique("monitoring"), dir.path()),
        port,
    ) + &format!(
        "\n[receiptroller.sources.main.api]\n{}\n[mekari.sources.main.api]\n{}\n\
         [reconcile]\nenabled = true\ninterval_secs = 1\ninitial_window_secs = 3600\n\
         [watchdog]\nenabled = true\ninterval_secs = 1\n\
         [mekari.sources.from_files]\nsecrets_files = [\"{}\"]\n",
        sim.api_toml(ProviderKind::ReceiptRoller, MEKARI_CLIENT_SECRET, false),
        sim.api_toml(ProviderKind::Mekari, MEKARI_CLIENT_SECRET, false),
        secret_file.display(),
    );
    // A sources directory with one file that does not check: the refused
    // files' gauge, in a process of its own.
    let sources = dir.path().join("sources");
    std::fs::create_dir(&sources).unwrap();
    std::fs::write(sources.join("mekari.broken.toml"), "secret = 1\n").unwrap();
    let text = format!("sources_dir = \"{}\"\n{text}", sources.display());
    let config = dir.path().join("posbridge.toml");
    std::fs::write(&config, text).unwrap();
    let _serving = Serving(spawn_serve(&config));
    let http = reqwest::Client::new();
    wait_healthy(&http, &base).await;
    let metrics = || async {
        let answer = http.get(format!("{base}/metrics")).send().await.unwrap();
        answer.text().await.unwrap()
    };

    // Before any webhook: the series an alert reads exist already. The last
    // to come is the watchdog's first check of each webhook, at start-up.
    let started = look_for(Duration::from_secs(30), async || {
        let text = metrics().await;
        let checked = |provider: ProviderKind| {
            text.lines().any(|l| {
                l.starts_with("posbridge_webhook_active{")
                    && l.contains(&format!("provider=\"{provider}\""))
            })
        };
        ProviderKind::ALL.into_iter().all(checked).then_some(text)
    })
    .await;
    let Some(started) = started else {
        panic!("the watchdog never checked:\n{}", metrics().await);
    };
    assert_exported(&for_rules, &started, "at start-up");
    assert_eq!(metric(&started, "posbridge_source_files_refused", &[]), 1.0);
    // Deliveries are decided once the ledger is filled and the broker
    // answered: before that they would spool or be told to come back.
    wait_until(
        Duration::from_secs(30),
        "posbridge to be ready",
        async || {
            let answer = http.get(format!("{base}/readyz")).send().await;
            answer.is_ok_and(|a| a.status() == 200)
        },
    )
    .await;

    // Some of everything: published, duplicate, stale, dead-lettered, refused.
    let send = |provider: &str, body: Vec<u8>, id: &str, secret: Option<&str>| {
        signed_request(&http, &base, provider, "main", id, body, secret).send()
    };
    let json = |body: &Value| serde_json::to_vec(body).unwrap();
    let newer = rr_sale(
        "mon-1",
        "sale.updated",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|0001",
        1100,
    );
    let older = rr_sale(
        "mon-2",
        "sale.updated",
        "2026-11-29T10:00:00Z",
        "T1|2026-11|0001",
        1000,
    );
    let order = mekari_order(
        "mon-3",
        "order.created",
        "2026-11-29T17:15:30+07:00",
        "ORD-M",
        "new",
    );
    let mut answers = Vec::new();
    for (provider, body, id, secret) in [
        ("receiptroller", json(&newer), "mon-1", None),
        ("receiptroller", json(&newer), "mon-1", None),
        ("receiptroller", json(&older), "mon-2", None),
        ("mekari", json(&order), "mon-3", None),
        ("receiptroller", b"not json".to_vec(), "mon-4", None),
        (
            "receiptroller",
            json(&older),
            "mon-5",
            Some("a-wrong-secret"),
        ),
    ] {
        let answer = send(provider, body, id, secret).await.unwrap();
        let status = answer.status().as_u16();
        let body: Value = answer.json().await.unwrap();
        answers.push((status, body["status"].as_str().unwrap_or("").to_owned()));
    }
    let expected = [
        (200, "published"),
        (200, "duplicate"),
        (200, "stale"),
        (200, "published"),
        (200, "dead_lettered"),
        (401, ""),
    ]
    .map(|(status, outcome)| (status, outcome.to_owned()));
    assert_eq!(answers, expected);

    let after = metrics().await;
    assert_exported(&for_rules, &after, "after traffic");
    assert_exported(&for_dashboard, &after, "after traffic");

    // The slow-answer alert's quantile needs buckets up to the providers' 10 s.
    let highest = after
        .lines()
        .filter(|l| l.starts_with("posbridge_webhook_request_duration_seconds_bucket{"))
        .filter_map(|l| {
            l.split("le=\"")
                .nth(1)?
                .split('"')
                .next()?
                .parse::<f64>()
                .ok()
        })
        .filter(|le| le.is_finite())
        .fold(0.0, f64::max);
    assert!(highest >= 10.0, "the highest finite bucket is {highest} s");
}

/// `posbridge reconciler` as a process of its own (the Helm chart's shared
/// shape) is scraped too: the watchdog's and the reconciler's series, which
/// the webhook-off, resumed and reconcile-failing alerts read, are on its
/// `/metrics` on `server.listen`, beside its probes, and it has no webhook
/// route, so a provider pointed at it is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_reconciler_of_its_own_serves_its_probes_and_the_watchdogs_metrics() {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let sim = Sim::start(&base, &["--events", "0"]).await;
    let dir = tempfile::tempdir().unwrap();
    let text = listening_on(
        &config_text(&brokers(), &unique("reconciler-ops"), dir.path()),
        port,
    ) + &format!(
        "\n[receiptroller.sources.main.api]\n{}\n[mekari.sources.main.api]\n{}\n\
         [reconcile]\ninterval_secs = 1\ninitial_window_secs = 3600\n\
         [watchdog]\ninterval_secs = 1\n",
        sim.api_toml(ProviderKind::ReceiptRoller, MEKARI_CLIENT_SECRET, false),
        sim.api_toml(ProviderKind::Mekari, MEKARI_CLIENT_SECRET, false),
    );
    let config = dir.path().join("posbridge.toml");
    std::fs::write(&config, text).unwrap();
    let _reconciler = Serving(spawn_posbridge("reconciler", &config));
    let http = reqwest::Client::new();
    wait_healthy(&http, &base).await;
    let get = |path: &str| http.get(format!("{base}{path}")).send();

    assert_eq!(get("/healthz").await.unwrap().status(), 200);
    let ready = get("/readyz").await.unwrap();
    assert_eq!(ready.status(), 200, "{:?}", ready.text().await);
    let webhook = http
        .post(format!("{base}/webhooks/mekari/main"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(webhook.status(), 404);

    let text = look_for(Duration::from_secs(30), async || {
        let text = get("/metrics").await.unwrap().text().await.unwrap();
        let has = |name: &str, provider: ProviderKind| {
            text.lines().any(|l| {
                l.starts_with(&format!("{name}{{"))
                    && l.contains(&format!("provider=\"{provider}\""))
            })
        };
        ProviderKind::ALL
            .into_iter()
            .all(|p| has("posbridge_webhook_active", p) && has("posbridge_reconcile_runs_total", p))
            .then_some(text)
    })
    .await;
    let Some(text) = text else {
        panic!(
            "the reconciler's /metrics never showed both webhooks checked and reconciled:\n{}",
            get("/metrics").await.unwrap().text().await.unwrap()
        );
    };
    assert!(
        text.contains("posbridge_webhook_resumes_total{"),
        "no resume counter:\n{text}"
    );
}
