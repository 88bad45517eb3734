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
# a machine without systemd: overlay2, the standard socket and data root (so images built once
# are reused by later starts). It waits until the daemon answers, then records its pid; `stop`
# stops only a daemon with that record. `make serve` needs none of this. Exit status: 0 ready, 1
# no engine could be had (the reason on stderr).
#
# Nothing may route into the containers' bridges: the host forwards IPv4 for them, and a
# neighbour that routes the bridge's subnet through this host would otherwise reach every
# container port, published or not (Triton, Redis, Alertmanager). So:
#   - where iptables works (DOCKER_ENGINE_IPTABLES=0 says it does not), dockerd keeps its own
#     firewall (--iptables=true), and DOCKER-USER drops what enters a Docker bridge from
#     elsewhere unless it is a published port (DNAT) or the reply of a connection from inside.
#     Docker 20.10 sets the FORWARD policy to DROP only where it turns forwarding on itself, so
#     a host that already forwarded would stay open without that rule;
#   - elsewhere dockerd runs without iptables and without turning forwarding on
#     (--ip-forward=false), and IPv4 forwarding is turned off. Containers on one bridge still
#     talk (the bridge switches, nothing is routed), published ports go through docker-proxy,
#     and builds use the host's network; what no container has is a way out through this host.
# The rule, and forwarding turned off, stay when dockerd stops.
set -euo pipefail

STATE=${DOCKER_ENGINE_STATE:-/run/triton-model-repository-engine}
PIDFILE=$STATE/dockerd.pid
LOG=$STATE/dockerd.log
FIREWALL=$STATE/firewall  # how the dockerd started here keeps its bridges closed
SOCKET=/var/run/docker.sock
WAIT_S=${DOCKER_ENGINE_WAIT_S:-60}

answers() {
    timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

started_here() {
    [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

# Whether dockerd can keep a firewall here: iptables answers and may add a chain.
iptables_works() {
    [ "${DOCKER_ENGINE_IPTABLES:-1}" != 0 ] && command -v iptables >/dev/null || return 1
    iptables -w 5 -N ENGINE-SH-PROBE >/dev/null 2>&1 || return 1
    iptables -w 5 -X ENGINE-SH-PROBE >/dev/null 2>&1
}

# The rules that keep what is not a published port from being routed into a Docker bridge.
bridge_rules() {
    local bridge
    for bridge in docker0 'br-+'; do
        echo "! -i $bridge -o $bridge -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
    done
}

close_forwarding() {
    local rule
    if [ "$1" = --iptables=true ]; then
        iptables -w 5 -N DOCKER-USER >/dev/null 2>&1 || true
        while read -r -a rule; do
            iptables -w 5 -C DOCKER-USER "${rule[@]}" 2>/dev/null ||
                iptables -w 5 -I DOCKER-USER "${rule[@]}"
        done < <(bridge_rules)
        echo "docker engine: iptables on; only published ports are routed into its bridges"
    elif [ "$(sysctl -n net.ipv4.ip_forward)" != 0 ]; then
        sysctl -qw net.ipv4.ip_forward=0
        echo "docker engine: no iptables; IPv4 forwarding turned off (it was on)"
    else
        echo "docker engine: no iptables; IPv4 forwarding stays off"
    fi
}

start() {
    if answers; then
        echo "docker engine: $(docker version --format 'Docker {{.Server.Version}}') answers" \
            "at ${DOCKER_HOST:-unix://$SOCKET}"
        # Ours: its bridges closed again as it was started, whatever changed since (one
        # started before this record was kept ran without iptables).
        if started_here; then
            close_forwarding "$(cat "$FIREWALL" 2>/dev/null || echo --iptables=false)"
        fi
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
    local firewall
    if iptables_works; then
        firewall=(--iptables=true)
    else
        firewall=(--iptables=false --ip-forward=false)
    fi
    # setsid: the daemon outlives this script and is not in the caller's process group, so a
    # Ctrl-C meant for the tests does not take it down mid-build.
    setsid dockerd "${firewall[@]}" --ip6tables=false --storage-driver=overlay2 \
        -H "unix://$SOCKET" --pidfile /var/run/docker.pid >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    echo "${firewall[0]}" >"$FIREWALL"
    for _ in $(seq 1 "$((WAIT_S * 5))"); do
        if answers; then
            echo "docker engine: started dockerd (pid $(cat "$PIDFILE"), log $LOG)"
            close_forwarding "${firewall[0]}"
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
        rm -f "$PIDFILE" "$FIREWALL"
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
    rm -f "$PIDFILE" "$FIREWALL"
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
    local rules=0 rule
    if iptables -w 5 -S DOCKER-USER >/dev/null 2>&1; then
        while read -r -a rule; do
            if iptables -w 5 -C DOCKER-USER "${rule[@]}" 2>/dev/null; then
                rules=$((rules + 1))
            fi
        done < <(bridge_rules)
    fi
    echo "IPv4 forwarding $(sysctl -n net.ipv4.ip_forward); rules closing the bridges: $rules"
}

case "${1:-}" in
    start | stop | status) "$1" ;;
    *)
        echo "usage: $0 start|stop|status" >&2
        exit 2
        ;;
esac
