# Stand-ins for the compose stack's Docker Hub images, from Debian 12's packages of the same
# software, for hosts that reach no image registry. Each stage behaves as its Hub image does
# for docker-compose.yml's commands (entrypoint, users, paths), so the compose file is the same
# for both: nginx 1.22.1 + njs (nginx:1.22.1), redis 7.0.15 (redis:7.0.15), prometheus 2.42
# (prom/prometheus) and alertmanager 0.25.0 (prom/alertmanager:v0.25.0).
#
#   python -m containers images --from debian      # builds the base below, then these stages
#
# DEBIAN_SERVICES: one Debian 12 root file system with all their packages (mmdebstrap +
# docker import, containers/images.py), shared by every stage's layers.
ARG DEBIAN_SERVICES=triton-model-repository/debian-services:bookworm

FROM ${DEBIAN_SERVICES} AS nginx
# The Hub image's layout: the njs module under /etc/nginx/modules, worker user nginx with uid
# 101 (the gateway renders `user nginx`; gateway-metrics runs as 101 to write to its log).
# Debian gave 101 to the redis and prometheus accounts (prometheus-alertmanager shares the
# latter), which this stage does not use.
RUN ln -s /usr/lib/nginx/modules /etc/nginx/modules \
    && sed -i -e '/^redis:/d' -e '/^prometheus:/d' /etc/passwd /etc/shadow \
    && sed -i -e '/^redis:/d' -e '/^prometheus:/d' /etc/group /etc/gshadow \
    && echo 'nginx:x:101:101:nginx user:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'nginx:x:101:' >> /etc/group
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]

FROM ${DEBIAN_SERVICES} AS redis
CMD ["redis-server"]

FROM ${DEBIAN_SERVICES} AS prometheus
# The Hub image runs as nobody, in /prometheus, with prometheus as its entrypoint.
RUN install -d -o nobody -g nogroup /prometheus
USER nobody
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]

FROM ${DEBIAN_SERVICES} AS alertmanager
# The Hub image runs as nobody, in /alertmanager, with alertmanager as its entrypoint (Debian
# names the binary prometheus-alertmanager; amtool is on PATH in both, for silences).
RUN install -d -o nobody -g nogroup /alertmanager
USER nobody
WORKDIR /alertmanager
ENTRYPOINT ["/usr/bin/prometheus-alertmanager"]
CMD ["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager"]
