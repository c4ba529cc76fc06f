#!/usr/bin/env bash
# Local Apache Kafka (KRaft, from the Apache jars on Maven Central) and Redis for development,
# tests and the demo. Everything lives under .local/ (git-ignored); processes are tracked by pid
# files; every subcommand is idempotent and says what it did.
#
#   infra/local.sh up | down | status
#   infra/local.sh kafka-start [ID] | kafka-stop [ID] | kafka-kill [ID]   (no ID: the single broker)
#   infra/local.sh redis-start | redis-stop | redis-kill
#   infra/local.sh redis-snapshot FILE | redis-restore FILE   (docs/operations.md: Backup and restore)
#   infra/local.sh redis-cluster-up | redis-cluster-down | redis-cluster-kill PORT
#                                 (3 masters, 3 replicas on RHUMBATRON_REDIS_CLUSTER_PORT=7000..7005)
#   infra/local.sh postgres-start | postgres-stop | postgres-kill   (Debian's PostgreSQL, 127.0.0.1:5432)
#   infra/local.sh cluster-up | cluster-down                              (brokers 1-3 on 9092-9094)
#   infra/local.sh jars                                                   (resolve the jars only)
#   infra/local.sh browser                  (Debian's chromium for the operator page's tests)
#   infra/local.sh node                     (node 20+ and the TypeScript examples' npm dependencies)
#   infra/local.sh prometheus-install       (Debian's prometheus and promtool, installed only)
#   infra/local.sh jaeger | jaeger-start | jaeger-stop   (Jaeger v2 from source; traces in memory)
#   infra/local.sh helm                     (Helm, pinned, built from source into .local/helm/)
#
# A private instance (for a chaos test that stops its broker without disturbing anyone else's)
# takes its own state folder and ports: RHUMBATRON_LOCAL_DIR=… RHUMBATRON_KAFKA_PORT=9192
# RHUMBATRON_REDIS_PORT=6479 RHUMBATRON_POSTGRES_PORT=5532 infra/local.sh up. The jars are shared.
# With RHUMBATRON_KAFKA_PROXY_PORT=P the single broker also has a PLAINTEXT listener on
# KAFKA_PORT+2000 that advertises 127.0.0.1:P, for clients that must go through a proxy on P.
#
# The single broker also has a secured listener, SASL_SSL on KAFKA_PORT+1000 (10092 by default),
# for testing Rhumbatron against a Kafka that wants TLS and a login (docs/kafka-security.md):
# SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN, a self-signed CA and broker certificate made with
# openssl at first start, users rh-admin (a super user) and rh-app, passwords generated once. All
# of it is kept in $STATE/kafka/secured/ (0700), beside client.env (RHUMBATRON_KAFKA_* variables
# to source) and client.properties (for Kafka's Java tools, --command-config). The StandardAuthorizer
# is on; the PLAINTEXT and controller listeners log in as User:ANONYMOUS, a super user, so
# nothing that uses them changes.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${RHUMBATRON_LOCAL_DIR:-$ROOT/.local}"
KAFKA_POM="$ROOT/infra/kafka/pom.xml"
JARS="${RHUMBATRON_KAFKA_JARS:-$ROOT/.local/kafka/jars}"
KAFKA_PORT="${RHUMBATRON_KAFKA_PORT:-9092}"
# A broker's heap grows with the partitions it holds: a benchmark run provisions a hundred topics
# (eight streams, queues, redelivery topics) and a few runs left behind by interrupted ones put
# several thousand partitions on it; at 512 MB the broker ran out of heap there and stopped
# answering. 2 GB is a ceiling, not a reservation (the heap starts at 256 MB).
KAFKA_HEAP="${RHUMBATRON_KAFKA_HEAP:--Xms256m -Xmx2g}"
KAFKA_START_TIMEOUT="${RHUMBATRON_KAFKA_START_TIMEOUT:-90}"
KAFKA_STOP_TIMEOUT="${RHUMBATRON_KAFKA_STOP_TIMEOUT:-30}"
REDIS_PORT="${RHUMBATRON_REDIS_PORT:-6379}"
CLUSTER_SIZE=3
SECURED="$STATE/kafka/secured"
SECURED_PORT=$((KAFKA_PORT + 1000))
SECURED_USERS="rh-admin rh-app"
SECURED_ADMIN=rh-admin
# A listener for clients that must reach the single broker through a TCP proxy (the chaos
# matrix's network rows, tests/support/tcp_proxy.py): with RHUMBATRON_KAFKA_PROXY_PORT set, the
# broker also listens on KAFKA_PORT+2000 and advertises the proxy's port for it, so a client
# bootstrapped through the proxy is sent back to the proxy for every broker connection and
# cannot bypass it. The proxy forwards to KAFKA_PORT+2000.
PROXY_PORT="${RHUMBATRON_KAFKA_PROXY_PORT:-}"
PROXIED_PORT=$((KAFKA_PORT + 2000))

say() { printf '[local] %s\n' "$*"; }
fail() { printf '[local] FAILED: %s\n' "$*" >&2; exit 1; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

python_bin() {
  if [ -x "$ROOT/.venv/bin/python" ]; then echo "$ROOT/.venv/bin/python"; else echo python3; fi
}

# ---------------------------------------------------------------------------------------------
# Kafka jars: resolved once by Maven, cached beside a hash of the pom so a second run downloads
# nothing and a changed pin re-resolves.
jars() {
  local want have=""
  want="$(sha256sum "$KAFKA_POM" | cut -d' ' -f1)"
  if [ -f "$JARS/.pom-sha256" ]; then have="$(cat "$JARS/.pom-sha256")"; fi
  if [ "$want" = "$have" ] && ls "$JARS"/kafka_2.13-*.jar >/dev/null 2>&1; then
    say "kafka jars cached in $JARS ($(ls "$JARS"/*.jar | wc -l) jars)"
    return
  fi
  command -v mvn >/dev/null || fail "mvn not found: install Maven to resolve the Kafka jars"
  command -v java >/dev/null || fail "java not found: Kafka needs Java 17"
  say "resolving kafka jars from Maven Central into $JARS"
  rm -rf "$JARS.tmp" && mkdir -p "$JARS.tmp" "$STATE/logs"
  if ! mvn -q -B -f "$KAFKA_POM" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$JARS.tmp" >"$STATE/logs/maven.log" 2>&1; then
    fail "maven could not resolve the kafka jars; see $STATE/logs/maven.log"
  fi
  echo "$want" >"$JARS.tmp/.pom-sha256"
  rm -rf "$JARS" && mv "$JARS.tmp" "$JARS"
  say "kafka jars ready ($(ls "$JARS"/*.jar | wc -l) jars)"
}

# Node layout: the single broker is "single" (node 1 on KAFKA_PORT, 9092 by default); cluster
# nodes are 1..3 on KAFKA_PORT..KAFKA_PORT+2. They share ports, so the two modes are never up
# together. Each node's controller listens 10000 above its broker port.
node_dir() { if [ "$1" = single ]; then echo "$STATE/kafka/single"; else echo "$STATE/kafka/cluster-$1"; fi; }
node_port() { if [ "$1" = single ]; then echo "$KAFKA_PORT"; else echo $((KAFKA_PORT - 1 + $1)); fi; }
node_id() { if [ "$1" = single ]; then echo 1; else echo "$1"; fi; }

write_properties() {
  local node="$1" dir port id
  dir="$(node_dir "$node")"; port="$(node_port "$node")"; id="$(node_id "$node")"
  mkdir -p "$dir/data" "$dir/logs"
  # The single broker's file holds the secured listener's passwords: readable by its owner only.
  rm -f "$dir/server.properties"
  (umask 077 && : >"$dir/server.properties")
  {
    echo "process.roles=broker,controller"
    echo "node.id=$id"
    if [ "$node" = single ]; then
      local proxied="" proxied_ad="" proxied_map=""
      if [ -n "$PROXY_PORT" ]; then
        proxied=",PROXIED://127.0.0.1:$PROXIED_PORT"
        proxied_ad=",PROXIED://127.0.0.1:$PROXY_PORT"
        proxied_map=",PROXIED:PLAINTEXT"
      fi
      echo "listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$SECURED_PORT,CONTROLLER://127.0.0.1:$((port + 10000))$proxied"
      echo "advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$SECURED_PORT$proxied_ad"
      echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT$proxied_map"
      secured_properties
    else
      # The cluster stays PLAINTEXT only: the secured listener is the single broker's.
      echo "listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$((port + 10000))"
      echo "advertised.listeners=PLAINTEXT://127.0.0.1:$port"
      echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    fi
    echo "controller.listener.names=CONTROLLER"
    echo "inter.broker.listener.name=PLAINTEXT"
    echo "log.dirs=$dir/data"
    echo "num.network.threads=2"
    echo "num.io.threads=4"
    echo "auto.create.topics.enable=false"
    echo "group.initial.rebalance.delay.ms=0"
    # Few internal partitions: faster first use of groups and transactions on a laptop.
    echo "offsets.topic.num.partitions=8"
    echo "transaction.state.log.num.partitions=8"
    echo "share.coordinator.state.topic.num.partitions=8"
    if [ "$node" = single ]; then
      echo "controller.quorum.bootstrap.servers=127.0.0.1:$((port + 10000))"
      echo "num.partitions=1"
      echo "default.replication.factor=1"
      echo "min.insync.replicas=1"
      echo "offsets.topic.replication.factor=1"
      echo "transaction.state.log.replication.factor=1"
      echo "transaction.state.log.min.isr=1"
      echo "share.coordinator.state.topic.replication.factor=1"
      echo "share.coordinator.state.topic.min.isr=1"
    else
      local voters="" n
      for n in $(seq 1 "$CLUSTER_SIZE"); do voters="$voters${voters:+,}$n@127.0.0.1:$((KAFKA_PORT - 1 + n + 10000))"; done
      echo "controller.quorum.voters=$voters"
      echo "num.partitions=1"
      echo "default.replication.factor=3"
      echo "min.insync.replicas=2"
      echo "offsets.topic.replication.factor=3"
      echo "transaction.state.log.replication.factor=3"
      echo "transaction.state.log.min.isr=2"
      echo "share.coordinator.state.topic.replication.factor=3"
      echo "share.coordinator.state.topic.min.isr=2"
    fi
  } >>"$dir/server.properties"
}

# ---------------------------------------------------------------------------------------------
# The single broker's secured listener. Its material is made once and kept, so a restart keeps
# the same CA, certificate and passwords (delete $SECURED to start over).
secret() { cat "$SECURED/$1"; }

secured_material() {
  (umask 077 && mkdir -p "$SECURED")
  chmod 700 "$SECURED"
  local name made=0
  for name in keystore $SECURED_USERS; do
    if [ ! -s "$SECURED/$name.password" ]; then
      (umask 077 && openssl rand -hex 24 >"$SECURED/$name.password") \
        || fail "openssl could not generate a password in $SECURED"
      made=1
    fi
  done
  if [ ! -s "$SECURED/ca.pem" ] || [ ! -s "$SECURED/ca.key" ]; then
    rm -f "$SECURED/broker.p12"
    (umask 077 && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -keyout "$SECURED/ca.key" -out "$SECURED/ca.pem" -days 3650 -subj "/CN=Rhumbatron local CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      >"$SECURED/openssl.log" 2>&1) || fail "openssl could not make the local CA; see $SECURED/openssl.log"
    made=1
  fi
  if [ ! -s "$SECURED/broker.p12" ]; then
    # SAN 127.0.0.1 and localhost: a client checking the broker's name (endpoint identification,
    # librdkafka's default) accepts it under either.
    printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" "basicConstraints=CA:FALSE" \
      "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \
      >"$SECURED/broker.ext"
    if ! (umask 077 &&
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$SECURED/broker.key" \
        -out "$SECURED/broker.csr" -subj "/CN=localhost" &&
      openssl x509 -req -in "$SECURED/broker.csr" -CA "$SECURED/ca.pem" -CAkey "$SECURED/ca.key" \
        -set_serial "0x$(openssl rand -hex 12)" -days 825 -extfile "$SECURED/broker.ext" \
        -out "$SECURED/broker.pem" &&
      openssl pkcs12 -export -name broker -in "$SECURED/broker.pem" -inkey "$SECURED/broker.key" \
        -certfile "$SECURED/ca.pem" -passout "file:$SECURED/keystore.password" \
        -out "$SECURED/broker.p12") >"$SECURED/openssl.log" 2>&1; then
      fail "openssl could not make the broker certificate; see $SECURED/openssl.log"
    fi
    rm -f "$SECURED/broker.csr" "$SECURED/broker.ext"
    made=1
  fi
  write_client_files
  if [ "$made" = 1 ]; then say "secured listener material made in $SECURED (CA, broker certificate, passwords)"; fi
}

# What a client needs to use the secured listener as rh-admin: RHUMBATRON_KAFKA_* variables for
# Rhumbatron (source it), and a properties file for Kafka's Java tools (--command-config).
write_client_files() {
  (umask 077 && {
    echo "# The local broker's secured listener (infra/local.sh); source this file."
    echo "RHUMBATRON_KAFKA_BOOTSTRAP=127.0.0.1:$SECURED_PORT"
    echo "RHUMBATRON_KAFKA_SECURITY_PROTOCOL=SASL_SSL"
    echo "RHUMBATRON_KAFKA_SASL_MECHANISM=SCRAM-SHA-512"
    echo "RHUMBATRON_KAFKA_SASL_USERNAME=$SECURED_ADMIN"
    echo "RHUMBATRON_KAFKA_SASL_PASSWORD=$(secret "$SECURED_ADMIN.password")"
    echo "RHUMBATRON_KAFKA_SSL_CA_FILE=$SECURED/ca.pem"
    echo "export RHUMBATRON_KAFKA_BOOTSTRAP RHUMBATRON_KAFKA_SECURITY_PROTOCOL RHUMBATRON_KAFKA_SASL_MECHANISM"
    echo "export RHUMBATRON_KAFKA_SASL_USERNAME RHUMBATRON_KAFKA_SASL_PASSWORD RHUMBATRON_KAFKA_SSL_CA_FILE"
  } >"$SECURED/client.env.tmp" && {
    echo "# The local broker's secured listener (infra/local.sh), for Kafka's tools: --command-config"
    echo "bootstrap.servers=127.0.0.1:$SECURED_PORT"
    echo "security.protocol=SASL_SSL"
    echo "sasl.mechanism=SCRAM-SHA-512"
    echo "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"$SECURED_ADMIN\" password=\"$(secret "$SECURED_ADMIN.password")\";"
    echo "ssl.truststore.type=PEM"
    echo "ssl.truststore.location=$SECURED/ca.pem"
  } >"$SECURED/client.properties.tmp")
  mv "$SECURED/client.env.tmp" "$SECURED/client.env"
  mv "$SECURED/client.properties.tmp" "$SECURED/client.properties"
}

secured_properties() {
  local user plain="" l="listener.name.sasl_ssl"
  for user in $SECURED_USERS; do plain="$plain user_$user=\"$(secret "$user.password")\""; done
  echo "sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN"
  echo "$l.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN"
  echo "$l.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
  echo "$l.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
  # PLAIN's users are the JAAS config's user_<name> entries (same passwords as for SCRAM).
  echo "$l.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required$plain;"
  echo "$l.ssl.keystore.type=PKCS12"
  echo "$l.ssl.keystore.location=$SECURED/broker.p12"
  echo "$l.ssl.keystore.password=$(secret keystore.password)"
  echo "$l.ssl.key.password=$(secret keystore.password)"
  echo "$l.ssl.client.auth=none"
  echo "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"
  # The PLAINTEXT and controller listeners authenticate nobody: their User:ANONYMOUS stays all-
  # powerful. rh-admin is the secured listener's super user; rh-app gets ACLs of its own.
  echo "super.users=User:ANONYMOUS;User:$SECURED_ADMIN"
}

# The SCRAM users as StorageTool format's --add-scram arguments (a fresh storage gets them in its
# first metadata records).
scram_format_args() {
  local user mechanism
  for user in $SECURED_USERS; do
    for mechanism in SCRAM-SHA-512 SCRAM-SHA-256; do
      printf '%s\n' --add-scram "$mechanism=[name=$user,password=$(secret "$user.password")]"
    done
  done
}

# What the storage's SCRAM users were made for: its directory id (a new format is new storage)
# and the passwords. Equal to the marker beside the storage: the users are there.
scram_stamp() {
  local dir="$1" user
  {
    grep '^directory.id=' "$dir/data/meta.properties" 2>/dev/null || true
    for user in $SECURED_USERS; do echo "$user $(secret "$user.password")"; done
  } | sha256sum | cut -d' ' -f1
}

# A storage formatted before the secured listener existed (or material made anew) lacks the
# users: create them against the running broker, through its PLAINTEXT listener, with Kafka's
# ConfigCommand (one credential per request, which is all it takes; they run side by side).
# With the marker in place the users were made, but the broker may have lost some since: Kafka
# 4.4's metadata snapshot keeps one SCRAM mechanism per user, so after a restart from a snapshot
# the other is gone (seen: SCRAM-SHA-512 logins refused, SCRAM-SHA-256 still there). Each start
# asks the broker which credentials it holds and makes the missing ones again.
ensure_scram_users() {
  local dir user mechanism stamp held="" pids=() failed=0 pid made=()
  dir="$(node_dir single)"
  stamp="$(scram_stamp "$dir")"
  if [ "$(cat "$dir/scram-users.stamp" 2>/dev/null || true)" = "$stamp" ]; then
    held="$(kafka_java "$dir" org.apache.kafka.tools.ConfigCommand \
      --bootstrap-server "127.0.0.1:$KAFKA_PORT" --describe --entity-type users 2>&1)" ||
      fail "could not list the broker's SCRAM users with kafka's ConfigCommand: $held"
  fi
  for user in $SECURED_USERS; do
    for mechanism in SCRAM-SHA-512 SCRAM-SHA-256; do
      if grep -q "user-principal '$user' are .*$mechanism=" <<<"$held"; then continue; fi
      made+=("$user/$mechanism")
      kafka_java "$dir" org.apache.kafka.tools.ConfigCommand --bootstrap-server "127.0.0.1:$KAFKA_PORT" \
        --alter --entity-type users --entity-name "$user" \
        --add-config "$mechanism=[password=$(secret "$user.password")]" \
        >"$SECURED/scram-users.$user.$mechanism.log" 2>&1 &
      pids+=($!)
    done
  done
  if [ "${#made[@]}" = 0 ]; then return; fi
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if [ "$failed" = 1 ]; then
    fail "could not create the SCRAM users with kafka's ConfigCommand; see $SECURED/scram-users.*.log"
  fi
  rm -f "$SECURED"/scram-users.*.log
  echo "$stamp" >"$dir/scram-users.stamp"
  if [ -n "$held" ]; then
    say "SCRAM credentials the broker had lost made again: ${made[*]}"
  else
    say "SCRAM users $SECURED_USERS created on the running broker (its storage predates them)"
  fi
}

# Sets KAFKA_JAVA to the java command line for a node (an array, so the classpath glob stays
# literal for java to expand).
kafka_java_argv() {
  local dir="$1" heap
  read -r -a heap <<<"$KAFKA_HEAP"
  KAFKA_JAVA=(java "${heap[@]}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
    -Dkafka.logs.dir="$dir/logs" -Dlog4j2.configurationFile="$ROOT/infra/kafka/log4j2.xml"
    -cp "$JARS/*")
}

kafka_java() {
  local dir="$1"; shift
  kafka_java_argv "$dir"
  "${KAFKA_JAVA[@]}" "$@"
}

await_node() {
  local node="$1" pid="$2"
  "$(python_bin)" "$ROOT/infra/kafka/await_metadata.py" "127.0.0.1:$(node_port "$node")" \
    "$(node_id "$node")" "$KAFKA_START_TIMEOUT" "$pid"
}

format_storage() {
  local node="$1" dir cluster_id
  dir="$(node_dir "$node")"
  if [ -f "$dir/data/meta.properties" ]; then return; fi
  if [ "$node" = single ]; then
    cluster_id="$(cat "$STATE/kafka/single.cluster-id" 2>/dev/null || true)"
  else
    cluster_id="$(cat "$STATE/kafka/cluster.cluster-id" 2>/dev/null || true)"
  fi
  if [ -z "$cluster_id" ]; then
    cluster_id="$(kafka_java "$dir" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
    [ -n "$cluster_id" ] || fail "could not generate a cluster id with kafka.tools.StorageTool"
    if [ "$node" = single ]; then echo "$cluster_id" >"$STATE/kafka/single.cluster-id"
    else echo "$cluster_id" >"$STATE/kafka/cluster.cluster-id"; fi
  fi
  local mode=()
  if [ "$node" = single ]; then mapfile -t mode < <(echo --standalone; scram_format_args); fi
  say "formatting kafka storage for node $node (cluster $cluster_id)"
  if ! kafka_java "$dir" kafka.tools.StorageTool format "${mode[@]}" -t "$cluster_id" \
      -c "$dir/server.properties" --feature share.version=1 >"$dir/logs/format.log" 2>&1; then
    fail "formatting kafka storage for node $node failed; see $dir/logs/format.log"
  fi
  if [ "$node" = single ]; then scram_stamp "$dir" >"$dir/scram-users.stamp"; fi
}

kafka_start() {
  local node="$1" dir port pidfile started
  dir="$(node_dir "$node")"; port="$(node_port "$node")"; pidfile="$dir/kafka.pid"
  if alive "$pidfile"; then say "kafka node $node already running (pid $(cat "$pidfile"), 127.0.0.1:$port)"; return; fi
  command -v java >/dev/null || fail "java not found: Kafka needs Java 17"
  jars
  local other
  if [ "$node" = single ]; then
    for other in $(seq 1 "$CLUSTER_SIZE"); do
      if alive "$(node_dir "$other")/kafka.pid"; then
        fail "cluster node $other is running on the single broker's port; run: infra/local.sh cluster-down"
      fi
    done
  elif alive "$(node_dir single)/kafka.pid"; then
    fail "the single broker is running on the cluster's ports; run: infra/local.sh kafka-stop"
  fi
  started=$(date +%s%3N)
  if [ "$node" = single ]; then secured_material; fi
  write_properties "$node"
  format_storage "$node"
  kafka_java_argv "$dir"
  nohup "${KAFKA_JAVA[@]}" kafka.Kafka "$dir/server.properties" >"$dir/logs/stdout.log" 2>&1 &
  echo $! >"$pidfile"
  say "kafka node $node starting (pid $(cat "$pidfile"), 127.0.0.1:$port)"
  if [ "$node" = single ] || [ "${WAIT_QUORUM:-1}" = 1 ]; then
    if ! await_node "$node" "$(cat "$pidfile")"; then
      tail -n 20 "$dir/logs/server.log" "$dir/logs/stdout.log" 2>/dev/null | sed 's/^/    /' >&2 || true
      fail "kafka node $node did not become ready; logs in $dir/logs"
    fi
    if [ "$node" = single ]; then ensure_scram_users; fi
    local ms=$(($(date +%s%3N) - started))
    say "kafka node $node ready in $((ms / 1000)).$(((ms % 1000) / 100))s"
    if [ "$node" = single ]; then
      say "kafka secured listener: SASL_SSL 127.0.0.1:$SECURED_PORT (source $SECURED/client.env)"
    fi
  fi
}

# Stops nodes: SIGTERM (or SIGKILL) to all named nodes at once, then waits, bounded; a node that
# outlives KAFKA_STOP_TIMEOUT (a broker whose controller quorum is already gone cannot finish a
# controlled shutdown) gets SIGKILL.
kafka_signal() {
  local signal="$1"; shift
  local node pidfile pids=() names=()
  for node in "$@"; do
    pidfile="$(node_dir "$node")/kafka.pid"
    if ! alive "$pidfile"; then rm -f "$pidfile"; continue; fi
    pids+=("$(cat "$pidfile")"); names+=("$node")
    kill "-$signal" "${pids[-1]}" 2>/dev/null || true
  done
  if [ ${#pids[@]} -eq 0 ]; then say "kafka node(s) $* not running"; return; fi
  local i waited=0 escalated=0
  for i in "${!pids[@]}"; do
    while kill -0 "${pids[$i]}" 2>/dev/null; do
      sleep 0.2; waited=$((waited + 1))
      if [ "$escalated" = 0 ] && [ "$waited" -ge $((KAFKA_STOP_TIMEOUT * 5)) ]; then
        say "kafka node(s) ${names[*]} did not stop in ${KAFKA_STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "${pids[@]}" 2>/dev/null || true
        escalated=1
      fi
    done
    rm -f "$(node_dir "${names[$i]}")/kafka.pid"
    say "kafka node ${names[$i]} $([ "$signal" = KILL ] && echo killed || echo stopped) (pid ${pids[$i]})"
  done
}

# ---------------------------------------------------------------------------------------------
redis_install() {
  command -v redis-server >/dev/null && return
  say "installing redis-server with apt-get"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  mkdir -p "$STATE/logs"
  if ! { $sudo apt-get install -y -qq redis-server || { $sudo apt-get update -qq && $sudo apt-get install -y -qq redis-server; }; } >"$STATE/logs/apt.log" 2>&1; then
    fail "apt-get could not install redis-server; see $STATE/logs/apt.log"
  fi
}

# The container tools the image's test builds with (tests/infra/test_image.py): Debian's podman,
# runc (crun refuses a hybrid cgroup hierarchy) and mmdebstrap (a stand-in base from Debian's own
# packages where no image registry answers; infra/deploy/build-image.sh).
image_tools() {
  local absent=() tool
  for tool in podman runc mmdebstrap; do command -v "$tool" >/dev/null || absent+=("$tool"); done
  [ ${#absent[@]} -eq 0 ] && { say "image tools present: $(podman --version)"; return; }
  command -v apt-get >/dev/null || fail "no apt-get to install ${absent[*]}: install podman, runc and mmdebstrap"
  say "installing ${absent[*]} with apt-get (log in $STATE/logs/apt-image-tools.log)"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  mkdir -p "$STATE/logs"
  if ! { $sudo apt-get install -y -qq "${absent[@]}" || { $sudo apt-get update -qq && $sudo apt-get install -y -qq "${absent[@]}"; }; } >"$STATE/logs/apt-image-tools.log" 2>&1; then
    fail "apt-get could not install ${absent[*]}; see $STATE/logs/apt-image-tools.log"
  fi
}

redis_start() { redis_start_with; }

# Started with extra redis-server options (redis-restore's --appendonly no).
redis_start_with() {
  local dir="$STATE/redis" pidfile="$STATE/redis/redis.pid"
  if alive "$pidfile"; then say "redis already running (pid $(cat "$pidfile"), 127.0.0.1:$REDIS_PORT)"; return; fi
  redis_install
  mkdir -p "$dir"
  cat >"$dir/redis.conf" <<EOF
bind 127.0.0.1
port $REDIS_PORT
protected-mode yes
daemonize yes
pidfile $pidfile
logfile $dir/redis.log
dir $dir
appendonly yes
appendfsync everysec
save ""
EOF
  redis-server "$dir/redis.conf" "$@" || fail "redis-server did not start; see $dir/redis.log"
  local i
  for i in $(seq 1 100); do
    if redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; then
      say "redis ready (pid $(cat "$pidfile"), 127.0.0.1:$REDIS_PORT, append-only in $dir)"
      return
    fi
    sleep 0.1
  done
  fail "redis did not answer PING within 10s; see $dir/redis.log"
}

# A snapshot of the running Redis (BGSAVE: the server keeps serving meanwhile) copied to FILE.
redis_snapshot() {
  local file="$1" dir="$STATE/redis" before i
  [ -n "$file" ] || fail "redis-snapshot needs the file to write"
  before="$(redis_persistence rdb_saves)"
  [ -n "$before" ] || fail "redis is not answering on $REDIS_PORT"
  redis-cli -h 127.0.0.1 -p "$REDIS_PORT" BGSAVE >/dev/null || fail "BGSAVE refused; see $dir/redis.log"
  for i in $(seq 1 600); do
    if [ "$(redis_persistence rdb_saves)" != "$before" ] && [ "$(redis_persistence rdb_bgsave_in_progress)" = 0 ]; then
      [ "$(redis_persistence rdb_last_bgsave_status)" = ok ] || fail "the snapshot failed; see $dir/redis.log"
      { cp "$dir/dump.rdb" "$file.tmp" && mv "$file.tmp" "$file"; } || fail "could not write the snapshot to $file"
      say "redis snapshot in $file"
      return
    fi
    sleep 0.1
  done
  fail "the snapshot did not finish within 60s; see $dir/redis.log"
}

# One field of the running Redis's INFO persistence.
redis_persistence() {
  { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" INFO persistence 2>/dev/null || true; } | tr -d '\r' | sed -n "s/^$1://p"
}

# Redis restored from the snapshot FILE: stopped, its data files replaced by the snapshot,
# started with append-only off (Redis 7 ignores a snapshot when append-only is on and finds no
# append-only files), then append-only turned on again, which rewrites the files from memory.
redis_restore() {
  local file="$1" dir="$STATE/redis" i
  [ -f "$file" ] || fail "redis-restore needs a snapshot file; '$file' is not one"
  redis_signal TERM
  rm -rf "$dir/appendonlydir" "$dir/dump.rdb"
  cp "$file" "$dir/dump.rdb"
  redis_start_with --appendonly no
  redis-cli -h 127.0.0.1 -p "$REDIS_PORT" CONFIG SET appendonly yes >/dev/null \
    || fail "could not turn append-only on again; see $dir/redis.log"
  for i in $(seq 1 600); do
    if [ "$(redis_persistence aof_enabled)" = 1 ] && [ "$(redis_persistence aof_rewrite_in_progress)" = 0 ] \
      && [ "$(redis_persistence aof_rewrite_scheduled)" = 0 ] && [ -f "$dir/appendonlydir/appendonly.aof.manifest" ]; then
      say "redis restored from $file ($(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" DBSIZE) keys; append-only again)"
      return
    fi
    sleep 0.1
  done
  fail "append-only was not rewritten within 60s; see $dir/redis.log"
}

redis_signal() {
  local signal="$1" pidfile="$STATE/redis/redis.pid" pid
  if ! alive "$pidfile"; then rm -f "$pidfile"; say "redis not running"; return; fi
  pid="$(cat "$pidfile")"
  kill "-$signal" "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  rm -f "$pidfile"
  say "redis $([ "$signal" = KILL ] && echo killed || echo stopped) (pid $pid)"
}

# ---------------------------------------------------------------------------------------------
# A Redis Cluster of REDIS_CLUSTER_NODES local redis-server processes (3 masters, 3 replicas by
# default) on REDIS_CLUSTER_PORT and the ports after it, each append-only in
# $STATE/redis-cluster/<port>. cluster-node-timeout is short (REDIS_CLUSTER_NODE_TIMEOUT_MS) so a
# killed master's replica is promoted within a few seconds, which is what the failover tests
# measure; a production cluster keeps Redis's default (15 s) or its own.
REDIS_CLUSTER_PORT="${RHUMBATRON_REDIS_CLUSTER_PORT:-7000}"
REDIS_CLUSTER_NODES=6
REDIS_CLUSTER_NODE_TIMEOUT_MS="${RHUMBATRON_REDIS_CLUSTER_NODE_TIMEOUT_MS:-2000}"
REDIS_CLUSTER_READY_TIMEOUT=60

redis_cluster_ports() { seq "$REDIS_CLUSTER_PORT" $((REDIS_CLUSTER_PORT + REDIS_CLUSTER_NODES - 1)); }
redis_cluster_pidfile() { echo "$STATE/redis-cluster/$1/redis.pid"; }

redis_cluster_node_start() {
  local port="$1" dir="$STATE/redis-cluster/$1" pidfile
  pidfile="$(redis_cluster_pidfile "$port")"
  if alive "$pidfile"; then return; fi
  mkdir -p "$dir"
  cat >"$dir/redis.conf" <<CONF
bind 127.0.0.1
port $port
protected-mode yes
daemonize yes
pidfile $pidfile
logfile $dir/redis.log
dir $dir
cluster-enabled yes
cluster-config-file $dir/nodes.conf
cluster-node-timeout $REDIS_CLUSTER_NODE_TIMEOUT_MS
repl-diskless-sync-delay 0
appendonly yes
appendfsync everysec
save ""
CONF
  redis-server "$dir/redis.conf" || fail "redis-server on port $port did not start; see $dir/redis.log"
}

# Ready: the cluster is ok, and a replica has its master's data (its link up). A replica still
# waiting for its first sync holds nothing, and a master killed then could not be failed over
# ("disconnected from master for longer than allowed").
redis_cluster_ok() {
  redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
  local replication
  replication="$(redis-cli -h 127.0.0.1 -p "$1" info replication 2>/dev/null)"
  case "$replication" in *role:slave*) printf '%s' "$replication" | grep -q '^master_link_status:up' ;; esac
}

redis_cluster_up() {
  redis_install
  local port i seeds=() missing=0
  for port in $(redis_cluster_ports); do redis_cluster_node_start "$port"; seeds+=("127.0.0.1:$port"); done
  for port in $(redis_cluster_ports); do
    for i in $(seq 1 100); do
      redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG && break
      [ "$i" = 100 ] && fail "redis cluster node $port did not answer PING within 10s; see $STATE/redis-cluster/$port/redis.log"
      sleep 0.1
    done
  done
  # A node that knows no other has never been joined: create the cluster once, over all of them.
  if [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_CLUSTER_PORT" cluster info | grep -c '^cluster_known_nodes:1\b' || true)" = 1 ]; then
    redis-cli --cluster create "${seeds[@]}" --cluster-replicas 1 --cluster-yes \
      >"$STATE/redis-cluster/create.log" 2>&1 \
      || fail "redis-cli --cluster create failed; see $STATE/redis-cluster/create.log"
  fi
  for i in $(seq 1 $((REDIS_CLUSTER_READY_TIMEOUT * 10))); do
    missing=0
    for port in $(redis_cluster_ports); do redis_cluster_ok "$port" || missing=1; done
    if [ "$missing" = 0 ]; then
      say "redis cluster ready: $(IFS=,; echo "${seeds[*]}") (3 masters, 3 replicas, append-only in $STATE/redis-cluster)"
      return
    fi
    sleep 0.1
  done
  fail "redis cluster did not reach cluster_state:ok on every node, with every replica in sync, within ${REDIS_CLUSTER_READY_TIMEOUT}s; see $STATE/redis-cluster/*/redis.log"
}

# Stops (TERM) or kills (KILL) the nodes on the ports given, or every node.
redis_cluster_signal() {
  local signal="$1" port pidfile pid
  shift
  # shellcheck disable=SC2046
  [ $# -gt 0 ] || set -- $(redis_cluster_ports)
  for port in "$@"; do
    case "$port" in *[!0-9]* | '') fail "unknown redis cluster port '$port'" ;; esac
    pidfile="$(redis_cluster_pidfile "$port")"
    if ! alive "$pidfile"; then rm -f "$pidfile"; continue; fi
    pid="$(cat "$pidfile")"
    kill "-$signal" "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    rm -f "$pidfile"
    say "redis cluster node $port $([ "$signal" = KILL ] && echo killed || echo stopped) (pid $pid)"
  done
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL (Debian's packages) for the PostgreSQL outbox and its tests (docs/outbox.md). initdb
# and postgres refuse to run as root, so as root they run as the `postgres` user, with a data
# directory that user owns outside the checkout (.local may be a 0700 tree it cannot enter);
# otherwise as the calling user, under $STATE/postgres. It listens on 127.0.0.1 only (and a
# socket in its own directory), with password logins (SCRAM) over TCP. A role and database named
# rhumbatron are made at first start; the role's password is generated once and kept 0600 in
# $STATE/postgres/password. `status` prints the URL with the password masked.
PG_PORT="${RHUMBATRON_POSTGRES_PORT:-5432}"
PG_ROLE=rhumbatron
PG_DB=rhumbatron
PG_STATE="$STATE/postgres"
PG_PASSWORD_FILE="$PG_STATE/password"
PG_START_TIMEOUT="${RHUMBATRON_POSTGRES_START_TIMEOUT:-60}"

pg_bin() {
  local dir
  dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
  if [ -n "$dir" ] && [ -x "$dir/postgres" ]; then echo "$dir"; fi
}

# Where the cluster lives: one per checkout state folder and port, so a private instance
# (RHUMBATRON_LOCAL_DIR, RHUMBATRON_POSTGRES_PORT) never shares files with the shared one.
pg_home() {
  if [ "$(id -u)" = 0 ]; then
    echo "/var/lib/rhumbatron-postgres/$(printf '%s' "$STATE" | sha256sum | cut -c1-12)-$PG_PORT"
  else
    echo "$PG_STATE/cluster-$PG_PORT"
  fi
}

# Runs a PostgreSQL program as the cluster's owner.
pg_as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_install() {
  if [ -n "$(pg_bin)" ]; then return; fi
  command -v apt-get >/dev/null || fail "PostgreSQL is not installed and there is no apt-get: install Debian's postgresql"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  mkdir -p "$STATE/logs"
  say "installing Debian's postgresql (apt-get; log in $STATE/logs/apt-postgresql.log)"
  # Debian's package would make and start a cluster of its own on 5432: ask it not to.
  $sudo mkdir -p /etc/postgresql-common
  if [ ! -f /etc/postgresql-common/createcluster.conf ]; then
    echo "create_main_cluster = false" | $sudo tee /etc/postgresql-common/createcluster.conf >/dev/null
  fi
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Options::=--force-confold postgresql)
  if ! { $sudo "${apt[@]}" || { $sudo apt-get update -q && $sudo "${apt[@]}"; }; } \
      >"$STATE/logs/apt-postgresql.log" 2>&1; then
    fail "apt-get could not install postgresql; see $STATE/logs/apt-postgresql.log"
  fi
  [ -n "$(pg_bin)" ] || fail "postgresql installed but no server binary in /usr/lib/postgresql/*/bin"
}

pg_password() {
  if [ ! -s "$PG_PASSWORD_FILE" ]; then
    (umask 077 && mkdir -p "$PG_STATE" && openssl rand -hex 24 >"$PG_PASSWORD_FILE") \
      || fail "openssl could not generate the PostgreSQL password in $PG_STATE"
  fi
  chmod 600 "$PG_PASSWORD_FILE"
  cat "$PG_PASSWORD_FILE"
}

pg_url() {
  local password="$1"
  echo "postgresql://$PG_ROLE:$password@127.0.0.1:$PG_PORT/$PG_DB"
}

pg_pid() { head -1 "$(pg_home)/data/postmaster.pid" 2>/dev/null || true; }

pg_alive() {
  local pid
  pid="$(pg_pid)"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

pg_start() {
  local home data bin password started
  home="$(pg_home)"; data="$home/data"
  if pg_alive; then
    say "postgres already running (pid $(pg_pid), 127.0.0.1:$PG_PORT, $(pg_url '***'))"
    return
  fi
  pg_install
  bin="$(pg_bin)"
  started=$(date +%s%3N)
  password="$(pg_password)"
  mkdir -p "$home" "$STATE/logs"
  if [ "$(id -u)" = 0 ]; then
    mkdir -p /var/lib/rhumbatron-postgres
    chmod 755 /var/lib/rhumbatron-postgres
    chown postgres:postgres "$home"
  fi
  chmod 700 "$home"
  if [ ! -f "$data/PG_VERSION" ]; then
    say "initialising a PostgreSQL cluster in $data ($("$bin/postgres" --version))"
    if ! pg_as_owner "$bin/initdb" -D "$data" -U postgres -E UTF8 --no-locale \
        --auth-local=peer --auth-host=scram-sha-256 >"$home/initdb.log" 2>&1; then
      fail "initdb failed; see $home/initdb.log"
    fi
    pg_as_owner sh -c "cat >>'$data/postgresql.conf'" <<EOC
# infra/local.sh
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$home'
max_connections = 200
shared_buffers = 128MB
password_encryption = 'scram-sha-256'
logging_collector = off
EOC
  fi
  # A crashed server leaves a stale pid file; postgres itself refuses one that is still alive.
  if ! pg_as_owner "$bin/pg_ctl" -D "$data" -l "$home/server.log" -w -t "$PG_START_TIMEOUT" \
      -o "-p $PG_PORT -k $home" start >"$home/pg_ctl.log" 2>&1; then
    tail -n 20 "$home/server.log" 2>/dev/null | sed 's/^/    /' >&2 || true
    fail "postgres did not start on 127.0.0.1:$PG_PORT; see $home/server.log"
  fi
  # The role (its password kept in step with the file) and its database, idempotently.
  if ! pg_as_owner "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$home" -p "$PG_PORT" -U postgres \
      -d postgres -v role="$PG_ROLE" -v db="$PG_DB" -v password="$password" \
      >"$home/setup.log" 2>&1 <<'EOS'
SELECT format('CREATE ROLE %I LOGIN CREATEDB', :'role')
  WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role') \gexec
ALTER ROLE :"role" WITH LOGIN CREATEDB PASSWORD :'password';
SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'role')
  WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db') \gexec
EOS
  then
    fail "could not create the $PG_ROLE role and database; see $home/setup.log"
  fi
  local ms=$(($(date +%s%3N) - started))
  say "postgres ready in $((ms / 1000)).$(((ms % 1000) / 100))s (pid $(pg_pid), $(pg_url '***'); password in $PG_PASSWORD_FILE)"
}

pg_signal() {
  local signal="$1" home pid bin
  home="$(pg_home)"
  if ! pg_alive; then say "postgres not running"; return; fi
  pid="$(pg_pid)"
  if [ "$signal" = KILL ]; then
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    say "postgres killed (pid $pid)"
    return
  fi
  bin="$(pg_bin)"
  pg_as_owner "$bin/pg_ctl" -D "$home/data" -m fast -w -t 60 stop >"$home/pg_ctl.log" 2>&1 \
    || fail "postgres did not stop; see $home/pg_ctl.log"
  say "postgres stopped (pid $pid)"
}

pg_status() {
  if pg_alive; then say "postgres: running (pid $(pg_pid), $(pg_url '***'); password in $PG_PASSWORD_FILE)"
  else say "postgres: stopped"; fi
}

# ---------------------------------------------------------------------------------------------
# Prometheus (Debian's package: prometheus and promtool) for the dashboards' tests
# (tests/infra/test_dashboards.py, docs/observability.md). Installed only: the tests start their own
# prometheus on a free port with a configuration and data directory of their own. Where an init
# system runs, Debian's package also starts its own service on :9090; nothing here uses it.
prometheus_install() {
  if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    say "prometheus present: $(prometheus --version 2>&1 | head -1)"
    return
  fi
  command -v apt-get >/dev/null || fail "prometheus is not installed and there is no apt-get: install Debian's prometheus"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  mkdir -p "$STATE/logs"
  say "installing Debian's prometheus (apt-get; log in $STATE/logs/apt-prometheus.log)"
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus)
  if ! { $sudo "${apt[@]}" || { $sudo apt-get update -q && $sudo "${apt[@]}"; }; } \
      >"$STATE/logs/apt-prometheus.log" 2>&1; then
    fail "apt-get could not install prometheus; see $STATE/logs/apt-prometheus.log"
  fi
  command -v promtool >/dev/null || fail "prometheus installed but promtool is not on PATH"
  say "prometheus installed: $(prometheus --version 2>&1 | head -1)"
}

# ---------------------------------------------------------------------------------------------
# Helm for the chart's tests (tests/router/test_helm_chart.py): built from source at a pinned
# version, once per machine; Go's caches in .local/go/.
HELM_VERSION=4.3.2
HELM_BIN="$ROOT/.local/helm/$HELM_VERSION/helm"

helm_build() {
  local gohome="$ROOT/.local/go" dir started
  dir="$(dirname "$HELM_BIN")"
  mkdir -p "$dir" "$STATE/logs"
  # Two callers at once: the second waits, then finds the binary.
  exec 8>"$dir.lock"
  flock 8
  if [ -x "$HELM_BIN" ]; then
    exec 8>&-
    say "helm present: $HELM_BIN ($("$HELM_BIN" version --short))"
    return
  fi
  command -v go >/dev/null || fail "go not found: Helm is built with the Go toolchain (1.24+)"
  started=$(date +%s)
  say "building helm v$HELM_VERSION (go install; log in $STATE/logs/helm-build.log)"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  # GOTOOLCHAIN=local: no Go downloaded; XDG_CONFIG_HOME: Go's files off $HOME; -X: its version.
  if ! env GOPATH="$gohome" GOMODCACHE="$gohome/pkg/mod" GOCACHE="$gohome/cache" \
      XDG_CONFIG_HOME="$gohome/config" GOBIN="$dir.tmp" GOFLAGS=-modcacherw GOTOOLCHAIN=local \
      CGO_ENABLED=0 go install -ldflags "-X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION" \
      "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION" >"$STATE/logs/helm-build.log" 2>&1; then
    exec 8>&-
    fail "go could not build helm v$HELM_VERSION; see $STATE/logs/helm-build.log"
  fi
  # Moved whole: an interrupted build leaves no binary.
  mv "$dir.tmp/helm" "$HELM_BIN" && rm -rf "$dir.tmp"
  exec 8>&-
  say "helm v$HELM_VERSION built in $(($(date +%s) - started))s: $HELM_BIN"
}

# ---------------------------------------------------------------------------------------------
# Jaeger (Apache-2.0), a trace store that takes OTLP, for the traces test
# (tests/tracing/test_traces_in_jaeger.py, docs/observability.md). Built from source through the Go
# module proxy, once per machine and version: module github.com/jaegertracing/jaeger at
# JAEGER_VERSION, whose cmd/jaeger is the Jaeger v2 binary. The binary lands in
# .local/jaeger/<version>/jaeger; Go's module cache, build cache and GOPATH are .local/go/ (as for
# Helm), so nothing is written to $HOME. Its configuration (infra/dashboards/jaeger/config.yaml) keeps
# traces in memory and listens on 127.0.0.1 only; the ports come from the environment:
#   RHUMBATRON_JAEGER_OTLP_GRPC_PORT (4317), RHUMBATRON_JAEGER_OTLP_HTTP_PORT (4318),
#   RHUMBATRON_JAEGER_QUERY_PORT (16686, the UI and the HTTP API /api/services, /api/traces),
#   RHUMBATRON_JAEGER_QUERY_GRPC_PORT (16685), RHUMBATRON_JAEGER_HEALTH_PORT (13133),
#   RHUMBATRON_JAEGER_METRICS_PORT (8888, its own metrics for Prometheus).
JAEGER_VERSION=1.75.0
JAEGER_HOME="$ROOT/.local/jaeger"
JAEGER_BIN="$JAEGER_HOME/$JAEGER_VERSION/jaeger"
JAEGER_CONFIG="$ROOT/infra/dashboards/jaeger/config.yaml"
JAEGER_START_TIMEOUT="${RHUMBATRON_JAEGER_START_TIMEOUT:-60}"
export RHUMBATRON_JAEGER_OTLP_GRPC_PORT="${RHUMBATRON_JAEGER_OTLP_GRPC_PORT:-4317}"
export RHUMBATRON_JAEGER_OTLP_HTTP_PORT="${RHUMBATRON_JAEGER_OTLP_HTTP_PORT:-4318}"
export RHUMBATRON_JAEGER_QUERY_PORT="${RHUMBATRON_JAEGER_QUERY_PORT:-16686}"
export RHUMBATRON_JAEGER_QUERY_GRPC_PORT="${RHUMBATRON_JAEGER_QUERY_GRPC_PORT:-16685}"
export RHUMBATRON_JAEGER_HEALTH_PORT="${RHUMBATRON_JAEGER_HEALTH_PORT:-13133}"
export RHUMBATRON_JAEGER_METRICS_PORT="${RHUMBATRON_JAEGER_METRICS_PORT:-8888}"

jaeger_build() {
  if [ -x "$JAEGER_BIN" ]; then say "jaeger $JAEGER_VERSION built: $JAEGER_BIN"; return; fi
  command -v go >/dev/null || fail "go not found: Jaeger $JAEGER_VERSION is built from source with Go 1.24 or newer"
  mkdir -p "$JAEGER_HOME" "$STATE/logs"
  # Two callers at once (make test-slow beside a developer's shell) build it once: the second
  # waits on the lock, then finds the binary.
  exec 9>"$JAEGER_HOME/.build.lock"
  flock 9
  if [ -x "$JAEGER_BIN" ]; then exec 9>&-; say "jaeger $JAEGER_VERSION built: $JAEGER_BIN"; return; fi
  local build="$JAEGER_HOME/$JAEGER_VERSION/build" log="$STATE/logs/jaeger-build.log" started
  started=$(date +%s)
  say "building jaeger $JAEGER_VERSION from the Go module proxy (a few minutes on a small machine; log in $log)"
  rm -rf "$build" && mkdir -p "$build"
  # -modcacherw: Go makes its module cache read-only, which would stop rm -rf .local.
  if ! (
    cd "$build"
    export GOPATH="$ROOT/.local/go" GOMODCACHE="$ROOT/.local/go/pkg/mod" GOCACHE="$ROOT/.local/go/cache"
    export GOFLAGS=-modcacherw GOTOOLCHAIN=local CGO_ENABLED=0
    go mod init rhumbatron.local/jaeger-build
    go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@v$JAEGER_VERSION"
    nice -n 19 go build -trimpath -o jaeger.tmp github.com/jaegertracing/jaeger/cmd/jaeger
  ) >"$log" 2>&1; then
    exec 9>&-
    fail "could not build jaeger $JAEGER_VERSION; see $log"
  fi
  mv "$build/jaeger.tmp" "$JAEGER_BIN"
  exec 9>&-
  say "jaeger $JAEGER_VERSION built in $(($(date +%s) - started))s: $JAEGER_BIN ($(du -m "$JAEGER_BIN" | cut -f1) MB)"
}

jaeger_api() { echo "http://127.0.0.1:$RHUMBATRON_JAEGER_QUERY_PORT"; }

jaeger_start() {
  local pidfile="$STATE/jaeger/jaeger.pid" log="$STATE/logs/jaeger.log" pid started
  if alive "$pidfile"; then
    say "jaeger already running (pid $(cat "$pidfile"), OTLP 127.0.0.1:$RHUMBATRON_JAEGER_OTLP_GRPC_PORT, API $(jaeger_api))"
    return
  fi
  jaeger_build
  mkdir -p "$STATE/jaeger" "$STATE/logs"
  started=$(date +%s%3N)
  nohup "$JAEGER_BIN" --config "$JAEGER_CONFIG" >"$log" 2>&1 &
  pid=$!
  echo "$pid" >"$pidfile"
  local deadline=$(($(date +%s) + JAEGER_START_TIMEOUT))
  until curl -fsS -o /dev/null "$(jaeger_api)/api/services" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$log" | sed 's/^/    /' >&2 || true
      fail "jaeger exited at start; see $log"
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      fail "jaeger did not answer on $(jaeger_api) within ${JAEGER_START_TIMEOUT}s; see $log"
    fi
    sleep 0.2
  done
  local ms=$(($(date +%s%3N) - started))
  say "jaeger ready in $((ms / 1000)).$(((ms % 1000) / 100))s (pid $pid, OTLP gRPC 127.0.0.1:$RHUMBATRON_JAEGER_OTLP_GRPC_PORT, OTLP HTTP 127.0.0.1:$RHUMBATRON_JAEGER_OTLP_HTTP_PORT, API $(jaeger_api))"
}

jaeger_stop() {
  local pidfile="$STATE/jaeger/jaeger.pid" pid
  if ! alive "$pidfile"; then say "jaeger not running"; rm -f "$pidfile"; return; fi
  pid="$(cat "$pidfile")"
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  rm -f "$pidfile"
  say "jaeger stopped (pid $pid)"
}

# ---------------------------------------------------------------------------------------------
# The operator page's tests drive Debian's chromium through Playwright's executable_path; the
# browser builds Playwright would download are never used.
browser() {
  if [ -x /usr/bin/chromium ]; then say "chromium present: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"; return; fi
  command -v apt-get >/dev/null || fail "/usr/bin/chromium is missing and there is no apt-get: install Debian's chromium"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  mkdir -p "$STATE/logs"
  say "installing Debian's chromium (apt-get; log in $STATE/logs/apt.log)"
  if ! { $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium; } \
      >"$STATE/logs/apt.log" 2>&1; then
    fail "apt-get could not install chromium; see $STATE/logs/apt.log"
  fi
  say "chromium installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
}

# ---------------------------------------------------------------------------------------------
# The TypeScript examples (examples/http-receiver, examples/ts-writer) run under node 20 or newer;
# Debian's node when the machine has none, and each example's own dependencies (TypeScript, node's
# types; pg and ajv for the writer) from the npm registry by its lock file.
node_tools() {
  local have=""
  if command -v node >/dev/null; then have="$(node --version 2>/dev/null || true)"; fi
  case "$have" in
    v2[0-9].* | v[3-9][0-9].*) say "node present: $have" ;;
    *)
      command -v apt-get >/dev/null || fail "node 20 or newer is missing and there is no apt-get: install node"
      local sudo=""
      if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
      mkdir -p "$STATE/logs"
      say "installing Debian's nodejs and npm (apt-get; log in $STATE/logs/apt-node.log)"
      if ! { $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q nodejs npm; } \
          >"$STATE/logs/apt-node.log" 2>&1; then
        fail "apt-get could not install nodejs; see $STATE/logs/apt-node.log"
      fi
      say "node installed: $(node --version)"
      ;;
  esac
  local example name
  for name in http-receiver ts-writer; do
    example="$ROOT/examples/$name"
    if [ ! -d "$example/node_modules" ] || [ "$example/package-lock.json" -nt "$example/node_modules" ]; then
      say "installing the $name example's dependencies (npm ci; log in $STATE/logs/npm-$name.log)"
      mkdir -p "$STATE/logs"
      (cd "$example" && npm ci --no-audit --no-fund --prefer-offline) >"$STATE/logs/npm-$name.log" 2>&1 \
        || fail "npm ci failed in $example; see $STATE/logs/npm-$name.log"
      touch "$example/node_modules"
    fi
  done
}

status() {
  local node pidfile
  for node in single $(seq 1 "$CLUSTER_SIZE"); do
    pidfile="$(node_dir "$node")/kafka.pid"
    if alive "$pidfile"; then
      say "kafka node $node: running (pid $(cat "$pidfile"), 127.0.0.1:$(node_port "$node"))"
      if [ "$node" = single ]; then
        say "kafka node single: secured listener SASL_SSL 127.0.0.1:$SECURED_PORT (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN; client settings in $SECURED/client.env)"
      fi
    elif [ "$node" = single ]; then say "kafka node single: stopped"; fi
  done
  if alive "$STATE/redis/redis.pid"; then say "redis: running (pid $(cat "$STATE/redis/redis.pid"), 127.0.0.1:$REDIS_PORT)"
  else say "redis: stopped"; fi
  pg_status
}

# The cluster is PLAINTEXT only (no secured listener, no authorizer): it is for replication and
# broker-loss tests; the secured listener is the single broker's.
cluster_up() {
  if alive "$(node_dir single)/kafka.pid"; then kafka_signal TERM single; fi
  local node
  # Controllers need a quorum before any of them answers: start all, then wait for each.
  for node in $(seq 1 "$CLUSTER_SIZE"); do WAIT_QUORUM=0 kafka_start "$node"; done
  for node in $(seq 1 "$CLUSTER_SIZE"); do
    if ! await_node "$node" "$(cat "$(node_dir "$node")/kafka.pid")"; then
      fail "cluster node $node did not become ready; logs in $(node_dir "$node")/logs"
    fi
  done
  say "cluster ready: 127.0.0.1:$KAFKA_PORT,127.0.0.1:$((KAFKA_PORT + 1)),127.0.0.1:$((KAFKA_PORT + 2))"
}

cluster_down() {
  # shellcheck disable=SC2046
  kafka_signal TERM $(seq 1 "$CLUSTER_SIZE")
}

cmd="${1:-}"; shift || true
node="${1:-single}"
case "$cmd" in
  redis-cluster-* | redis-snapshot | redis-restore) ;;
  *) case "$node" in single | 1 | 2 | 3) ;; *) fail "unknown kafka node '$node': use 1, 2 or 3 (cluster) or no id (single broker)" ;; esac ;;
esac
mkdir -p "$STATE/kafka"
case "$cmd" in
  up) kafka_start single; redis_start; pg_start; prometheus_install ;;
  down) cluster_down; kafka_signal TERM single; redis_signal TERM; redis_cluster_signal TERM; pg_signal TERM ;;
  status) status ;;
  jars) jars ;;
  browser) browser ;;
  node) node_tools ;;
  prometheus-install) prometheus_install ;;
  jaeger) jaeger_build ;;
  jaeger-start) jaeger_start ;;
  jaeger-stop) jaeger_stop ;;
  helm) helm_build ;;
  image-tools) image_tools ;;
  kafka-start) kafka_start "$node" ;;
  kafka-stop) kafka_signal TERM "$node" ;;
  kafka-kill) kafka_signal KILL "$node" ;;
  redis-start) redis_start ;;
  redis-stop) redis_signal TERM ;;
  redis-kill) redis_signal KILL ;;
  redis-snapshot) redis_snapshot "${1:-}" ;;
  redis-restore) redis_restore "${1:-}" ;;
  postgres-start) pg_start ;;
  postgres-stop) pg_signal TERM ;;
  postgres-kill) pg_signal KILL ;;
  cluster-up) cluster_up ;;
  cluster-down) cluster_down ;;
  redis-cluster-up) redis_cluster_up ;;
  redis-cluster-down) redis_cluster_signal TERM ;;
  redis-cluster-kill) [ $# -gt 0 ] || fail "redis-cluster-kill needs the port of the node to kill"; redis_cluster_signal KILL "$@" ;;
  *) fail "unknown command '${cmd}': use up, down, status, jars, browser, kafka-start|kafka-stop|kafka-kill [ID], redis-start|redis-stop|redis-kill, redis-snapshot|redis-restore FILE, postgres-start|postgres-stop|postgres-kill, prometheus-install, jaeger, jaeger-start, jaeger-stop, helm, cluster-up, cluster-down, redis-cluster-up, redis-cluster-down, redis-cluster-kill PORT" ;;
esac
