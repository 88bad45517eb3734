#!/usr/bin/env bash
# The container engine the compose stack and the container tests run on.
#
#   docker/engine.sh start     # use the Docker daemon that answers, or start Debian's dockerd
#   docker/engine.sh stop      # stop the dockerd that `start` started (nothing else)
#   docker/engine.sh status    # which daemon answers, and whether we started it
#
# `start` first asks the daemon the docker client reaches ($DOCKER_HOST, else the default
# socket). Where none answers and this is root with Debian's docker.io installed (`apt-get
# install --no-install-recommends docker.io docker-compose runc`), it starts dockerd itself, as on
# a machine without systemd: no iptables rules (--iptables=false; builds then use the host's
# network, and published ports go through docker-proxy), overlay2, the standard socket and data
# root (so images built once are reused by later starts). It waits until the daemon answers,
# then records its pid; `stop` stops only a daemon with that record. `make serve` needs none of
# this. Exit status: 0 ready, 1 no engine could be had (the reason on stderr).
set -euo pipefail

STATE=${DOCKER_ENGINE_STATE:-/run/triton-model-repository-engine}
PIDFILE=$STATE/dockerd.pid
LOG=$STATE/dockerd.log
SOCKET=/var/run/docker.sock
WAIT_S=${DOCKER_ENGINE_WAIT_S:-60}

answers() {
    timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

started_here() {
    [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

start() {
    if answers; then
        echo "docker engine: $(docker version --format 'Docker {{.Server.Version}}') answers" \
            "at ${DOCKER_HOST:-unix://$SOCKET}"
        return 0
    fi
    if [ -n "${DOCKER_HOST:-}" ]; then
        echo "docker engine: nothing answers at DOCKER_HOST=$DOCKER_HOST" >&2
        return 1
    fi
    if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
        echo "docker engine: no daemon answers and dockerd is not installed" \
            "(apt-get install --no-install-recommends docker.io docker-compose runc)" >&2
        return 1
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "docker engine: no daemon answers; start Docker (or run this as root to start" \
            "dockerd)" >&2
        return 1
    fi
    mkdir -p "$STATE"
    # setsid: the daemon outlives this script and is not in the caller's process group, so a
    # Ctrl-C meant for the tests does not take it down mid-build.
    setsid dockerd --iptables=false --ip6tables=false --storage-driver=overlay2 \
        -H "unix://$SOCKET" --pidfile /var/run/docker.pid >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 "$((WAIT_S * 5))"); do
        if answers; then
            echo "docker engine: started dockerd (pid $(cat "$PIDFILE"), log $LOG)"
            return 0
        fi
        if ! started_here; then
            break
        fi
        sleep 0.2
    done
    echo "docker engine: dockerd did not answer within ${WAIT_S} s; its log ($LOG):" >&2
    tail -n 20 "$LOG" >&2 || true
    stop >/dev/null 2>&1 || true
    return 1
}

stop() {
    if ! started_here; then
        rm -f "$PIDFILE"
        echo "docker engine: not started by this script; left as it is"
        return 0
    fi
    local pid
    pid=$(cat "$PIDFILE")
    kill -TERM "$pid"
    # dockerd stops its containers first (each within its stop timeout), then exits.
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "docker engine: dockerd $pid still running after 30 s; killing it" >&2
        kill -KILL "$pid"
    fi
    rm -f "$PIDFILE"
    echo "docker engine: stopped dockerd (pid $pid)"
}

status() {
    if answers; then
        echo "docker engine: $(docker version --format 'Docker {{.Server.Version}}') answers"
    else
        echo "docker engine: no daemon answers"
    fi
    if started_here; then
        echo "started by this script: pid $(cat "$PIDFILE")"
    fi
}

case "${1:-}" in
    start | stop | status) "$1" ;;
    *)
        echo "usage: $0 start|stop|status" >&2
        exit 2
        ;;
esac
