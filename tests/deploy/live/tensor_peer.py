#!/usr/bin/env python3
"""A tensord client for the deploy stage, run in containers and on the host alike.

  tensor_peer.py publish NAME NBYTES SEED   puts NBYTES seeded random bytes under NAME
  tensor_peer.py hold NAME                  gets NAME, reads every byte, and holds it
  tensor_peer.py expect NAME SHA256 GEN     gets NAME and checks its bytes and generation
  tensor_peer.py absent NAME                checks that NAME is not bound

Each prints one JSON line: the tensor's sha256, generation, size, and for `hold` the address
of its data in this process and this process's pid, so the stage can find the pages it maps
(/proc/PID/maps and /proc/PID/pagemap, read by root on the host). `hold` keeps the tensor
until a line arrives on stdin (or stdin closes), then releases it and exits. `expect` exits 1
with the reason when the bytes or the generation differ, `absent` when the name is bound.

The socket is $TENSORD_SOCKET; a daemon of another uid is trusted through
$TENSORD_TRUSTED_DAEMON_UIDS, as for any client.
"""

import hashlib
import json
import os
import sys

import numpy as np
import tensord


def describe(tensor, array):
    return {
        "sha256": hashlib.sha256(array.tobytes()).hexdigest(),
        "generation": tensor.generation,
        "nbytes": int(array.nbytes),
    }


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    command, name = argv[1], argv[2]
    client = tensord.connect(client_name=f"deploy-{command}")
    if command == "publish":
        nbytes, seed = int(argv[3]), int(argv[4])
        data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
        client.put(name, data)
        tensor = client.get(name, timeout=5.0)
        print(json.dumps(describe(tensor, tensor.numpy())), flush=True)
        tensor.release()
        return 0
    if command == "hold":
        tensor = client.get(name, timeout=30.0)
        array = tensor.numpy()
        facts = describe(tensor, array)  # reading every byte maps every page here
        facts["address"] = int(array.__array_interface__["data"][0])
        facts["pid"] = os.getpid()
        print(json.dumps(facts), flush=True)
        sys.stdin.readline()
        del array
        tensor.release()
        return 0
    if command == "expect":
        want_sha, want_generation = argv[3], int(argv[4])
        tensor = client.get(name, timeout=30.0)
        facts = describe(tensor, tensor.numpy())
        print(json.dumps(facts), flush=True)
        if facts["sha256"] != want_sha:
            print(f"{name}: bytes differ (sha256 {facts['sha256']}, expected {want_sha})",
                  file=sys.stderr)
            return 1
        if facts["generation"] != want_generation:
            print(f"{name}: generation {facts['generation']}, expected {want_generation}",
                  file=sys.stderr)
            return 1
        return 0
    if command == "absent":
        try:
            tensor = client.get(name, timeout=0)
        except tensord.NotFound as gone:
            print(json.dumps({"absent": name, "reason": str(gone)}), flush=True)
            return 0
        print(f"{name} is bound: {describe(tensor, tensor.numpy())}", file=sys.stderr)
        return 1
    sys.exit(f"tensor_peer: unknown command {command!r}\n{__doc__}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
