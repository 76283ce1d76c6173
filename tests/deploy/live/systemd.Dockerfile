# A Debian 12 machine with systemd as PID 1, for the deploy stage's systemd checks
# (tests/deploy/live/systemd_units.py): the runtime libraries of the tensord image, systemd,
# and what an operator has after `cmake --install` of the build (under /usr/local). The units
# are not installed here: the check installs them as docs/deployment.md tells an operator to.
#
# Context: a folder the stage fills (run.sh): staging/ (DESTDIR of `cmake --install`),
# repo/deploy/systemd/ (the units and the configuration file) and tensor_peer.py.
ARG RUNTIME_BASE=tensord-runtime-base:deploy-test
FROM ${RUNTIME_BASE}
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends systemd systemd-sysv procps python3 python3-numpy \
 && rm -rf /var/lib/apt/lists/*
# The runtime image adds the tensord user; an operator's machine does not have it, and the
# docs' `useradd` makes it.
RUN userdel tensord
COPY staging/ /
COPY repo/ /opt/tensord-src/
COPY tensor_peer.py /opt/tensord-test/tensor_peer.py
ENV container=docker
# systemd's own request to shut down (halt) on SIGRTMIN+3, so `docker stop` is clean.
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/lib/systemd/systemd"]
