//! docker-compose.yml runs the servers the tests run, at the versions they
//! run: a user who starts the stack with Docker gets what the suite proved.
//! Each version is read where the scripts take it from, so bumping one
//! place alone fails here.

use std::path::Path;

fn file(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text between `open` and the next `close` in `text`.
fn between<'a>(text: &'a str, open: &str, close: &str) -> &'a str {
    let start = text
        .find(open)
        .unwrap_or_else(|| panic!("no {open} in the file"))
        + open.len();
    let end = text[start..].find(close).expect("its end") + start;
    &text[start..end]
}

/// Every `image:` of docker-compose.yml.
fn compose_images() -> Vec<String> {
    file("docker-compose.yml")
        .lines()
        .filter_map(|line| line.trim().strip_prefix("image:"))
        .map(|image| image.trim().to_owned())
        .collect()
}

#[test]
fn compose_runs_the_brokers_registry_and_database_of_the_tests() {
    let kafka = between(&file("servers/kafka/pom.xml"), "<kafka.version>", "<").to_owned();
    let apicurio = between(&file("scripts/ensure-apicurio"), "\nversion=", "\n").to_owned();
    let postgres = between(&file("scripts/postgres"), "/usr/lib/postgresql/", "/bin").to_owned();
    let images = compose_images();
    for expected in [
        format!("apache/kafka:{kafka}"),
        format!("apicurio/apicurio-registry:{apicurio}"),
        format!("postgres:{postgres}"),
    ] {
        assert!(
            images.contains(&expected),
            "{expected} not in docker-compose.yml: {images:?}"
        );
    }
}

#[test]
fn the_compose_connect_worker_is_the_one_the_scripts_assemble() {
    let kafka = between(&file("servers/kafka/pom.xml"), "<kafka.version>", "<").to_owned();
    let worker = between(
        &file("deploy/connect/worker/pom.xml"),
        "<kafka.version>",
        "<",
    )
    .to_owned();
    assert_eq!(
        worker, kafka,
        "the Connect worker and the broker are one Kafka release"
    );
    let dockerfile = file("deploy/connect/Dockerfile");
    assert!(
        dockerfile.contains(&format!("\nFROM apache/kafka:{worker}\n")),
        "deploy/connect/Dockerfile builds on apache/kafka:{worker}"
    );
    // The same plugin definitions and checksums as scripts/ensure-connect.
    for part in ["debezium-jdbc", "apicurio-converter"] {
        assert!(dockerfile.contains(part), "the image assembles {part}");
        assert!(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("deploy/connect/plugins/{part}/jars.sha256"))
                .is_file()
        );
    }
    assert!(
        dockerfile.contains("sha256sum --quiet --strict -c"),
        "the image checks the jars"
    );
}
