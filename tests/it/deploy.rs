//! The Helm chart (`deploy/helm/posbridge`) in both shapes, offline:
//! `helm lint` and `helm template` with the values files in its `ci/`,
//! every rendered document decoded strictly into Kubernetes' own API types
//! by `deploy/check`, and the config file the chart writes read by
//! `posbridge check-config` with the environment the chart gives the
//! container. scripts/test builds helm and the check (scripts/ensure-helm,
//! scripts/ensure-manifest-check) and names them in `POSBRIDGE_TEST_HELM`
//! and `POSBRIDGE_TEST_MANIFEST_CHECK`. No cluster is involved: what only a
//! cluster shows (the pods starting, probes, rotation of mounted files) is
//! not tested here.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use posbridge::config::{Config, LedgerBackend};
use serde_json::Value;

/// The two shapes, each with `deploy/helm/posbridge/ci/<shape>-values.yaml`.
const SHAPES: [&str; 2] = ["embedded", "shared"];

fn tool(variable: &str, script: &str) -> PathBuf {
    std::env::var_os(variable)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("{variable} is not set: scripts/test sets it to what scripts/{script} prints")
        })
}

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/posbridge")
}

fn values(shape: &str) -> String {
    chart()
        .join("ci")
        .join(format!("{shape}-values.yaml"))
        .display()
        .to_string()
}

/// Runs `program args` with `input` on its standard input: its standard
/// output, or what it said on standard error when it failed.
fn run(program: &Path, args: &[&str], input: &str) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned() + &stdout)
    }
}

fn helm(args: &[&str]) -> Result<String, String> {
    run(&tool("POSBRIDGE_TEST_HELM", "ensure-helm"), args, "")
}

/// `helm template` of one shape, with more `helm` arguments.
fn render(shape: &str, more: &[&str]) -> Result<String, String> {
    let chart = chart().display().to_string();
    let values = values(shape);
    let mut args = vec![
        "template",
        "pb",
        &chart,
        "--namespace",
        "pos",
        "--values",
        &values,
    ];
    args.extend_from_slice(more);
    helm(&args)
}

/// One shape rendered and passed through deploy/check: the decoded objects.
fn rendered(shape: &str) -> Vec<Value> {
    rendered_with(shape, &[])
}

/// [`rendered`] with more `helm` arguments.
fn rendered_with(shape: &str, more: &[&str]) -> Vec<Value> {
    let manifests = render(shape, more).unwrap_or_else(|e| panic!("helm template {shape}: {e}"));
    let json = run(
        &tool("POSBRIDGE_TEST_MANIFEST_CHECK", "ensure-manifest-check"),
        &["-json"],
        &manifests,
    )
    .unwrap_or_else(|e| {
        panic!("the {shape} shape's manifests are not what Kubernetes takes:\n{e}")
    });
    serde_json::from_str(&json).unwrap()
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn has(objects: &[Value], kind: &str, name: &str) -> bool {
    objects
        .iter()
        .any(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// The config file the chart writes into its ConfigMap.
fn config_file(objects: &[Value]) -> String {
    object(objects, "ConfigMap", "pb-posbridge")["data"]["posbridge.toml"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The Services the ServiceMonitor scrapes `/metrics` of on their http
/// port, by name.
fn scraped(objects: &[Value]) -> Vec<&str> {
    let monitor = &object(objects, "ServiceMonitor", "pb-posbridge")["spec"];
    assert_eq!(monitor["endpoints"][0]["port"], "http");
    assert_eq!(monitor["endpoints"][0]["path"], "/metrics");
    let mut names: Vec<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "Service" && monitor_selects(monitor, o))
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    names
}

/// Whether a ServiceMonitor's `selector` (its `matchLabels` and
/// `matchExpressions` with `In`) picks `service` by its labels.
fn monitor_selects(monitor: &Value, service: &Value) -> bool {
    let labels = &service["metadata"]["labels"];
    let selector = &monitor["selector"];
    let matched = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(key, value)| labels[key] == *value);
    let expressed = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|expression| {
            assert_eq!(expression["operator"], "In", "only In is read here");
            let values = expression["values"].as_array().unwrap();
            values.contains(&labels[expression["key"].as_str().unwrap()])
        });
    matched && expressed
}

fn container(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]["containers"][0]
}

/// `posbridge check-config` on the chart's config file with `container`'s
/// environment and nothing else: its plain values as they are, each value
/// from a Secret replaced by a stand-in of the kind that key holds.
fn check_config(objects: &[Value], container: &Value) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("posbridge.toml");
    std::fs::write(&file, config_file(objects)).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_posbridge"));
    command
        .env_clear()
        .args(["check-config", "--config"])
        .arg(&file);
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap();
        let value = match var["value"].as_str() {
            Some(value) => value,
            None if name.ends_with("__REDIS_URL") => "redis://:stand-in@redis:6379",
            None => "stand-in-secret-1",
        };
        command.env(name, value);
    }
    command.output().unwrap()
}

#[test]
fn the_chart_lints_in_both_shapes() {
    let chart = chart().display().to_string();
    for shape in SHAPES {
        let values = values(shape);
        if let Err(e) = helm(&["lint", "--strict", &chart, "--values", &values]) {
            panic!("helm lint, {shape} shape:\n{e}");
        }
    }
}

/// The embedded shape: one replica whose one volume holds ledger and spool,
/// the reconciler inside it; the shared shape: replicas on Redis, a volume
/// each for its spool, the reconciler in a Deployment of one, probed like
/// the replicas and scraped through a Service of its own that the webhook
/// Service never routes to.
#[test]
fn both_shapes_render_what_kubernetes_accepts() {
    for shape in SHAPES {
        let objects = rendered(shape);
        let set = object(&objects, "StatefulSet", "pb-posbridge");
        let config = Config::from_toml(&config_file(&objects)).unwrap();
        let pod = &set["spec"]["template"]["spec"];
        let posbridge = container(set);
        let claims = set["spec"]["volumeClaimTemplates"].as_array().unwrap();
        assert_eq!(claims.len(), 1, "{shape}: one volume per replica");
        assert_eq!(claims[0]["metadata"]["name"], "data");
        let data_mount = posbridge["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "data")
            .unwrap();
        assert_eq!(data_mount["mountPath"], "/var/lib/posbridge");
        assert!(config.spool.path.starts_with("/var/lib/posbridge"));

        match shape {
            "embedded" => {
                assert_eq!(set["spec"]["replicas"], 1);
                assert_eq!(config.ledger.backend, LedgerBackend::Embedded);
                assert!(config.ledger.path.starts_with("/var/lib/posbridge"));
                assert!(config.reconcile.enabled, "inside the one replica");
                assert!(!has(&objects, "Deployment", "pb-posbridge-reconciler"));
                assert_eq!(scraped(&objects), ["pb-posbridge"]);
                // Helm reads numbers as floats; the file has them as written.
                assert!(config_file(&objects).contains("body_limit_bytes = 2097152\n"));
                // shutdown_timeout_ms = 20000: 5 s preStop + the default
                // 10 s drain delay + 3 × 20 s + 5 s.
                assert_eq!(pod["terminationGracePeriodSeconds"], 80);
            }
            _ => {
                assert_eq!(set["spec"]["replicas"], 3);
                assert_eq!(config.ledger.backend, LedgerBackend::Redis);
                let reconciler = object(&objects, "Deployment", "pb-posbridge-reconciler");
                let process = container(reconciler);
                assert_eq!(process["args"][0], "reconciler");
                assert_eq!(process["ports"][0]["name"], "http");
                assert_eq!(process["ports"][0]["containerPort"], 8080);
                for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
                    assert_eq!(process[probe], posbridge[probe], "{probe}");
                }
                let pod_labels = |workload: &Value| {
                    workload["spec"]["template"]["metadata"]["labels"]
                        .as_object()
                        .unwrap()
                        .clone()
                };
                let selects = |service: &str, labels: &serde_json::Map<String, Value>| {
                    object(&objects, "Service", service)["spec"]["selector"]
                        .as_object()
                        .unwrap()
                        .iter()
                        .all(|(key, value)| labels.get(key) == Some(value))
                };
                let (replica, reconciler) = (pod_labels(set), pod_labels(reconciler));
                assert!(selects("pb-posbridge", &replica));
                assert!(!selects("pb-posbridge", &reconciler), "providers reach it");
                assert!(selects("pb-posbridge-reconciler", &reconciler));
                assert!(!selects("pb-posbridge-reconciler", &replica));
                assert_eq!(
                    scraped(&objects),
                    ["pb-posbridge", "pb-posbridge-reconciler"]
                );
                // The defaults: drain_delay_ms and shutdown_timeout_ms 10000.
                assert_eq!(pod["terminationGracePeriodSeconds"], 50);
            }
        }

        assert_eq!(posbridge["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(posbridge["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        let security = &posbridge["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["capabilities"]["drop"][0], "ALL");
        assert!(has(&objects, "PodDisruptionBudget", "pb-posbridge"));
        assert!(has(&objects, "Service", "pb-posbridge"));
    }
}

/// A pod told to stop keeps serving through the preStop sleep (its endpoint
/// leaving the Service), then through posbridge's `drain_delay_ms` (`/readyz`
/// 503), then has three `shutdown_timeout_ms` to finish: the grace period
/// holds all of it, with posbridge's own defaults where the values set
/// nothing (the chart's copies of them must agree), and with values that
/// change each.
#[test]
fn the_grace_period_holds_the_prestop_sleep_the_drain_and_the_shutdown() {
    for (shape, more) in [
        ("embedded", &[][..]),
        ("shared", &[][..]),
        (
            "shared",
            &[
                "--set",
                "preStopSleepSeconds=8",
                "--set",
                "config.server.drain_delay_ms=30500",
                "--set",
                "config.server.shutdown_timeout_ms=4000",
            ][..],
        ),
        ("embedded", &["--set", "config.server.drain_delay_ms=0"][..]),
    ] {
        let objects = rendered_with(shape, more);
        let config = Config::from_toml(&config_file(&objects)).unwrap();
        let set = object(&objects, "StatefulSet", "pb-posbridge");
        let pod = &set["spec"]["template"]["spec"];
        let sleep = container(set)["lifecycle"]["preStop"]["exec"]["command"]
            .as_array()
            .unwrap();
        assert_eq!(sleep[0], "sleep", "{shape} {more:?}");
        let pre_stop: u64 = sleep[1].as_str().unwrap().parse().unwrap();
        let server = &config.server;
        let shutdown_ms = server.drain_delay_ms + 3 * server.shutdown_timeout_ms;
        let needed = pre_stop + shutdown_ms.div_ceil(1000);
        assert_eq!(
            pod["terminationGracePeriodSeconds"],
            needed + 5,
            "{shape} {more:?}: preStop {pre_stop} s, drain {} ms, shutdown 3 × {} ms, 5 s to spare",
            server.drain_delay_ms,
            server.shutdown_timeout_ms
        );
        if more.is_empty() {
            assert_eq!(
                server.drain_delay_ms,
                posbridge::config::ServerConfig::default().drain_delay_ms,
                "the chart sets no drain delay of its own"
            );
        }
    }
}

/// The status page has a listener of its own: on loopback unless exposed,
/// and then with a Service of its own, never on the webhook Service.
#[test]
fn the_admin_listener_is_reached_only_when_exposed() {
    let ports = |set: &Value| -> Vec<String> {
        container(set)["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let embedded = rendered("embedded");
    let config = Config::from_toml(&config_file(&embedded)).unwrap();
    assert_eq!(config.admin.listen.as_deref(), Some("127.0.0.1:9090"));
    assert_eq!(config.server.listen, "0.0.0.0:8080");
    assert_eq!(
        ports(object(&embedded, "StatefulSet", "pb-posbridge")),
        ["http"]
    );
    assert!(!has(&embedded, "Service", "pb-posbridge-admin"));

    let shared = rendered("shared");
    let config = Config::from_toml(&config_file(&shared)).unwrap();
    assert_eq!(config.admin.listen.as_deref(), Some("0.0.0.0:9090"));
    assert_eq!(
        ports(object(&shared, "StatefulSet", "pb-posbridge")),
        ["http", "admin"]
    );
    assert_eq!(
        object(&shared, "Service", "pb-posbridge-admin")["spec"]["ports"][0]["targetPort"],
        "admin"
    );
    for service in ["pb-posbridge", "pb-posbridge-headless"] {
        let ports = &object(&shared, "Service", service)["spec"]["ports"];
        assert_eq!(ports.as_array().unwrap().len(), 1, "{service}");
        assert_eq!(ports[0]["targetPort"], "http", "{service}");
    }
}

/// `sourcesSecret`: the Secret of source files mounted whole (updated in
/// place, not a `subPath`) where the config's `sources_dir` points.
#[test]
fn a_secret_of_source_files_is_mounted_as_the_sources_directory() {
    let objects = rendered_with("embedded", &["--set", "sourcesSecret=pb-sources"]);
    let config = Config::from_toml(&config_file(&objects)).unwrap();
    assert_eq!(
        config.sources_dir.as_deref(),
        Some(Path::new("/etc/posbridge/sources"))
    );
    let pod = &object(&objects, "StatefulSet", "pb-posbridge")["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "sources")
        .expect("a sources volume");
    assert_eq!(volume["secret"]["secretName"], "pb-sources");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "sources")
        .expect("a sources mount");
    assert_eq!(mount["mountPath"], "/etc/posbridge/sources");
    assert_eq!(mount["readOnly"], true);
    assert!(mount.get("subPath").is_none());
    let refused = render(
        "embedded",
        &[
            "--set",
            "sourcesSecret=pb-sources",
            "--set",
            "config.sources_dir=/elsewhere",
        ],
    )
    .unwrap_err();
    assert!(
        refused.contains("config.sources_dir is set by the chart"),
        "{refused}"
    );
    assert!(
        rendered("embedded")
            .iter()
            .all(|o| !o.to_string().contains("pb-sources"))
    );
}

/// What the chart writes, with the environment it sets (secrets from
/// Kubernetes Secrets as `POSBRIDGE__…` overrides), is a configuration
/// posbridge takes, for every process of both shapes.
#[test]
fn posbridge_accepts_the_config_the_chart_writes() {
    for shape in SHAPES {
        let objects = rendered(shape);
        let workloads: Vec<&Value> = objects
            .iter()
            .filter(|o| o["kind"] == "StatefulSet" || o["kind"] == "Deployment")
            .collect();
        assert_eq!(workloads.len(), 2 - usize::from(shape == "embedded"));
        for workload in workloads {
            let output = check_config(&objects, container(workload));
            let said = String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr);
            assert!(
                output.status.success() && said.contains("configuration is valid"),
                "posbridge check-config refuses the {shape} shape's config with the environment of {}:\n{said}\n{}",
                workload["metadata"]["name"],
                config_file(&objects)
            );
        }
    }
}

/// Mistakes posbridge would only find after the pods start, or that would
/// leak a secret into a ConfigMap, stop `helm install` with the fix.
#[test]
fn the_chart_refuses_what_posbridge_cannot_run_or_should_not_hold() {
    for (shape, set, expected) in [
        (
            "embedded",
            "replicas=2",
            "the embedded ledger is a file one process alone may hold",
        ),
        (
            "embedded",
            "config.mekari.sources.main.secrets=in-the-configmap",
            "would put webhook secrets in a ConfigMap",
        ),
        (
            "embedded",
            "config.kafka.librdkafka.sasl\\.password=plain",
            "is a credential",
        ),
        ("embedded", "admin.expose=true", "name admin.token"),
        (
            "shared",
            "config.server.listen=0.0.0.0:9999",
            "config.server.listen is set by the chart",
        ),
        (
            "shared",
            "replicass=3",
            "additional properties 'replicass' not allowed",
        ),
    ] {
        match render(shape, &["--set", set]) {
            Ok(_) => panic!("{shape} with {set} rendered"),
            Err(said) => assert!(said.contains(expected), "{shape} with {set}: {said}"),
        }
    }
}
