#!/usr/bin/env bash
# start DIR: initdb + start a PostgreSQL server on a free loopback port, print its URL.
# stop DIR: stop it. Runs as the 'postgres' user (the server refuses root).
set -euo pipefail
cmd=$1; dir=$2
find_bin() {
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && { echo "$d"; return; }; done
  command -v pg_ctl >/dev/null && { dirname "$(command -v pg_ctl)"; return; }
  return 1
}
PGBIN=$(find_bin || true)
if [ -z "$PGBIN" ]; then
  echo "installing Debian's postgresql for the tests..." >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) >&2
  PGBIN=$(find_bin)
fi
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
case $cmd in
  start)
    chmod 755 "$dir"; mkdir -p "$dir/data"; [ "$(id -u)" = 0 ] && chown -R postgres "$dir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    as_pg "$PGBIN/initdb" -D "$dir/data" -U shoal --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >&2 \
      || { cat "$dir/server.log" >&2; exit 1; }
    as_pg "$PGBIN/createdb" -h 127.0.0.1 -p "$port" -U shoal shoal_test >&2 2>/dev/null \
      || as_pg psql -h 127.0.0.1 -p "$port" -U shoal -d postgres -c 'CREATE DATABASE shoal_test' >&2
    echo "postgresql+psycopg://shoal@127.0.0.1:$port/shoal_test"
    ;;
  stop)
    [ -d "$dir/data" ] && as_pg "$PGBIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    ;;
esac
