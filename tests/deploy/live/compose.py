#!/usr/bin/env python3
"""deploy/docker/compose.yaml brought up with Debian's compose tool (docker-compose 1.29).

`up -d --build` (BuildKit through the docker client, COMPOSE_DOCKER_CLI_BUILD=1), then: the
daemon service turns healthy, the two clients start only after that (depends_on:
service_healthy), the trainer reports 1000 batches taken from the producer, and
`down --volumes` stops everything and removes the volume.

Usage: compose.py --docker PATH --compose PATH --file deploy/docker/compose.yaml
"""

import argparse
import os

from live_common import expect, log, main_guard, run, wait_for

PROJECT = "tensord-deploy-compose"


def body():
    parser = argparse.ArgumentParser()
    parser.add_argument("--docker", required=True)
    parser.add_argument("--compose", required=True)
    parser.add_argument("--file", required=True)
    args = parser.parse_args()
    env = dict(os.environ, COMPOSE_DOCKER_CLI_BUILD="1", DOCKER_BUILDKIT="1")
    compose = [args.compose, "-f", args.file, "-p", PROJECT]
    run(compose + ["version"])
    run(compose + ["down", "--volumes", "--remove-orphans"], env=env)
    try:
        run(compose + ["up", "-d", "--build"], env=env, timeout=1800)
        daemon = run(compose + ["ps", "-q", "tensord"], env=env)
        _, waited = wait_for(
            "the compose daemon healthy",
            lambda: run([args.docker, "inspect", "-f", "{{.State.Health.Status}}",
                         daemon],
                        quiet=True) == "healthy", timeout=60)
        log(f"ok: the compose daemon is healthy ({waited:.1f} s after `up` returned)")
        logs, waited = wait_for(
            "the trainer reporting 1000 batches",
            lambda: (lambda text: "trainer: 1000 batches" in text and text)(
                run(compose + ["logs", "--no-color", "trainer"], env=env, quiet=True)),
            timeout=120, interval=2.0)
        log(f"ok: the trainer took 1000 batches within {waited:.1f} s")
        log(logs)
        run(compose + ["ps"], env=env)
        for service in ("producer", "trainer"):
            cid = run(compose + ["ps", "-q", service], env=env)
            state = run([args.docker, "inspect", "-f", "{{.State.Status}}", cid])
            expect(state == "running", f"the {service} service is running", state)
    finally:
        run(compose + ["logs", "--no-color", "--tail", "20"], env=env, check=False)
        run(compose + ["down", "--volumes", "--remove-orphans"], env=env)


if __name__ == "__main__":
    main_guard(body)
