# Helpers the demos share (sourced by scripts/demo and scripts/outage-demo):
# narration, stopping what a demo started (and only that), reading metrics
# and JSON. The sourcing script sets `demo_name` and `posbridge_url`.

say() { printf '%s\n' "$*"; }
section() { printf '\n== %s\n' "$*"; }
die() { printf '%s: %s\n' "$demo_name" "$*" >&2; exit 1; }

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# --- stopping what we started, and only that --------------------------------
pids=()
stop() {   # PID NAME: SIGTERM, up to 15 s to finish, then SIGKILL
  local pid=$1 name=$2
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    sleep 0.1
  done
  say "$demo_name: $name did not stop within 15 s; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ ${#pids[@]} -gt 0 ]; then
    say ""
    say "$demo_name: stopping the simulator, posbridge and the broker"
    # Reverse start order: simulator, posbridge, broker.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
      stop "${pids[$i]%%:*}" "${pids[$i]#*:}"
    done
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- metrics and JSON helpers ------------------------------------------------
metrics() { curl -fsS "$posbridge_url/metrics"; }
# sum_metric TEXT NAME [label="value" ...]: sum of the samples with all those labels.
sum_metric() {
  local text=$1 name=$2; shift 2
  printf '%s\n' "$text" | awk -v name="$name" -v want="$*" '
    BEGIN { n = split(want, w, " ") }
    index($0, name "{") == 1 || index($0, name " ") == 1 {
      ok = 1
      for (i = 1; i <= n; i++) if (index($0, w[i]) == 0) ok = 0
      if (ok) s += $NF
    }
    END { printf "%d\n", s }'
}
# json_get JSON PATH: a field by dotted path, e.g. deliveries.dropped.
json_get() {
  python3 -c 'import json, sys
v = json.loads(sys.argv[1])
for part in sys.argv[2].split("."):
    v = v[part]
print(json.dumps(v) if isinstance(v, (dict, list, bool)) or v is None else v)' "$1" "$2"
}
alive() { kill -0 "$1" 2>/dev/null; }


# --- build and tools ---------------------------------------------------------
# prepare_tools: builds posbridge and posbridge-sim (release), gets the
# broker (Apache Kafka's jars from Maven Central, or tansu) and the Python
# client for reading topics (into $venv, once).
prepare_tools() {
  section "Building posbridge and posbridge-sim (release)"
  cargo build --release --workspace --bins

  section "Getting the tools"
  if [ "$("$here/scripts/local-broker" --which)" = kafka ]; then
    say "Apache Kafka: $("$here/scripts/ensure-kafka")"
  else
    # Once per machine: unpacked from ../shared/bin, or built with cargo install (16-35 min).
    say "tansu broker (no Java 17 + Maven for Apache Kafka): $("$here/scripts/ensure-tansu")"
  fi
  if ! "$venv/bin/python" -c 'import confluent_kafka.schema_registry.avro' 2>/dev/null; then
    say "creating $venv with Confluent's Python client (once)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet 'confluent-kafka[avro,schemaregistry]'
  fi
  say "Python Kafka client: $venv"
}
